//! `counter-svc [--config FILE] [serve]`: serve CounterService and its consumers. counter-svc
//! keeps no SQL tables, so `migrate` has nothing to do and says so.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    socialgraph_server::cli::service_main("counter-svc", socialgraph_counter::run, |_config: socialgraph_counter::Config| async {
        tracing::info!("counter-svc keeps its state in Redis: no migrations to run");
        Ok(())
    })
    .await
}
