//! The HTTP/JSON gateway in front of a test mesh, and a small JSON client for it that records
//! which routes a test called.

use std::collections::BTreeSet;
use std::sync::Mutex;

use reqwest::Method;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Mesh;

pub use socialgraph_gateway::Config as GatewayConfig;

/// The gateway running inside the test process.
pub struct GatewaySvc {
    /// `http://127.0.0.1:PORT` of the HTTP/JSON port.
    pub base: String,
    /// `http://127.0.0.1:PORT` of the admin port.
    pub admin: String,
    /// Fires graceful shutdown.
    pub shutdown: CancellationToken,
    /// The gateway task.
    pub task: JoinHandle<anyhow::Result<()>>,
    /// `Service.Method` of every route called through [`GatewaySvc::call`].
    pub called: Mutex<BTreeSet<String>>,
    /// The route table, read once, to name the route of each call.
    routes: Vec<socialgraph_httpapi::Route>,
    client: reqwest::Client,
}

/// One answer: HTTP status, headers and the body as JSON (`Null` when empty or not JSON).
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Response headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub json: Value,
}

impl Answer {
    /// The ErrorInfo reason among the details of an error body, or "".
    pub fn reason(&self) -> String {
        let details = self.json["details"].as_array().cloned().unwrap_or_default();
        details.iter().find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo").and_then(|d| d["reason"].as_str()).unwrap_or("").to_owned()
    }
}

/// Starts the gateway in front of `mesh` on free loopback ports, with `tweak` applied to its
/// configuration.
///
/// # Errors
/// It did not start.
pub async fn spawn_gateway(mesh: &Mesh, tweak: impl FnOnce(&mut GatewayConfig)) -> anyhow::Result<GatewaySvc> {
    let mut config = GatewayConfig::default();
    config.upstream.relation_url = format!("http://{}", mesh.relation.addr);
    config.upstream.projection_url = format!("http://{}", mesh.projection.addr);
    config.upstream.counter_url = format!("http://{}", mesh.counter.addr);
    config.upstream.message_url = String::new();
    tweak(&mut config);
    spawn_gateway_with(config).await
}

/// Starts the gateway with `config` (its listen addresses replaced by free loopback ports).
///
/// # Errors
/// It did not start.
pub async fn spawn_gateway_with(config: GatewayConfig) -> anyhow::Result<GatewaySvc> {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (base, admin_base) = (format!("http://{}", http.local_addr()?), format!("http://{}", admin.local_addr()?));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(socialgraph_gateway::run(config, http, admin, shutdown.clone()));
    let client = reqwest::Client::new();
    let ready = socialgraph_testkit::eventually(std::time::Duration::from_secs(30), "the gateway to be ready", || {
        let (client, url, ended) = (&client, format!("{admin_base}/ready"), task.is_finished());
        async move {
            anyhow::ensure!(!ended, "the gateway stopped before it was ready");
            Ok(client.get(url).send().await.ok().filter(|r| r.status().is_success()).map(|_| ()))
        }
    })
    .await;
    if let Err(e) = ready {
        return Err(if task.is_finished() { task.await?.err().unwrap_or(e) } else { e });
    }
    let routes = socialgraph_httpapi::routes(&socialgraph_httpapi::pool()?)?;
    Ok(GatewaySvc { base, admin: admin_base, shutdown, task, called: Mutex::new(BTreeSet::new()), routes, client })
}

impl GatewaySvc {
    /// Sends `method path` with `body` (JSON, when given) and `headers`; records the route.
    ///
    /// # Errors
    /// The request could not be sent.
    pub async fn call_with(&self, method: Method, path: &str, body: Option<Value>, headers: &[(&str, &str)]) -> anyhow::Result<Answer> {
        let bare = path.split('?').next().unwrap_or(path);
        if let Some(r) = self.routes.iter().find(|r| r.method == method.as_str() && r.template.matches(bare).is_some()) {
            self.called.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.insert(r.label());
        }
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b.to_string());
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await?;
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        let text = resp.text().await?;
        Ok(Answer { status, headers, json: serde_json::from_str(&text).unwrap_or(Value::Null) })
    }

    /// [`Self::call_with`] without extra headers.
    ///
    /// # Errors
    /// The request could not be sent.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Answer> {
        self.call_with(method, path, body, &[]).await
    }

    /// A GET of the admin port's `path`: status and body text.
    ///
    /// # Errors
    /// The request could not be sent.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let resp = self.client.get(format!("{}{path}", self.admin)).send().await?;
        Ok((resp.status().as_u16(), resp.text().await?))
    }

    /// Stops the gateway.
    ///
    /// # Errors
    /// It ended with an error.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await?
    }
}
