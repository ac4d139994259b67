//! `message-svc [--config FILE] [serve|migrate]`: serve the service, or run the migrations.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    socialgraph_server::cli::service_main("message-svc", socialgraph_message::run, |config: socialgraph_message::Config| async move {
        socialgraph_message::migrate(&config).await
    })
    .await
}
