//! The HTTP server under the gateway's router, with the time limits a public listener needs:
//! headers must arrive within the request timeout (slow or idle clients are disconnected instead
//! of holding a connection open), HTTP/2 header lists are bounded like HTTP/1's, and shutdown
//! stops accepting, then waits for in-flight requests up to the drain time.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Limits of the connections the server accepts.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Longest wait for a request's headers, also between requests on a kept-alive connection.
    pub header_read_timeout: Duration,
    /// Largest HTTP/2 header list (HTTP/1 headers are counted by the handler).
    pub max_header_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    pub drain: Duration,
}

/// Serves `app` on `listener` (TCP_NODELAY on every connection) until `shutdown` fires.
pub async fn serve(listener: TcpListener, app: Router, limits: ConnLimits, shutdown: CancellationToken) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = builder.serve_connection(TokioIo::new(tcp), service).into_owned();
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(drain_ms = limits.drain.as_millis() as u64, "drain timed out; closing remaining requests");
    }
}
