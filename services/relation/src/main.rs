//! `relation-svc [--config FILE] [serve|migrate]`: serve the service, or run the migrations.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    socialgraph_server::cli::service_main("relation-svc", socialgraph_relation::run, |config: socialgraph_relation::Config| async move {
        socialgraph_relation::migrate(&config).await
    })
    .await
}
