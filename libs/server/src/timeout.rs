//! Per-request deadline for unary RPCs, with exemptions for long-running admin methods
//! (bulk imports, scans, rebuilds) whose duration grows with the data.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

/// Ends RPCs that run longer than `timeout` with DEADLINE_EXCEEDED, except the methods whose
/// full path (`/package.Service/Method`) is listed in `exempt`.
#[derive(Clone)]
pub struct RequestTimeoutLayer {
    timeout: Duration,
    exempt: Arc<[String]>,
}

impl RequestTimeoutLayer {
    /// A layer with `timeout` for every method but `exempt`.
    pub fn new(timeout: Duration, exempt: &[&str]) -> Self {
        Self { timeout, exempt: exempt.iter().map(|s| (*s).to_owned()).collect() }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout { inner, timeout: self.timeout, exempt: Arc::clone(&self.exempt) }
    }
}

/// The service of [`RequestTimeoutLayer`].
#[derive(Clone)]
pub struct RequestTimeout<S> {
    inner: S,
    timeout: Duration,
    exempt: Arc<[String]>,
}

impl<S, B> Service<http::Request<B>> for RequestTimeout<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let exempt = self.exempt.iter().any(|p| p == req.uri().path());
        let timeout = self.timeout;
        let fut = self.inner.call(req);
        Box::pin(async move {
            if exempt {
                return fut.await;
            }
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Ok(tonic::Status::deadline_exceeded(format!("the request took longer than {timeout:?}")).into_http()),
            }
        })
    }
}
