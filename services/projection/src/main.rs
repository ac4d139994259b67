//! `projection-svc [--config FILE] [serve|migrate]`: serve the service, or run the migrations.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    socialgraph_server::cli::service_main("projection-svc", socialgraph_projection::run, |config: socialgraph_projection::Config| async move {
        socialgraph_projection::migrate(&config).await
    })
    .await
}
