//! Property-based fuzzing of the gateway from its own OpenAPI document (schemathesis, from
//! `.venv`, installed by `make deps`) against the real mesh: no generated input gets a 5xx, and
//! every response conforms to the document (status, content type, schema).

use socialgraph_integration_tests::Mesh;
use socialgraph_integration_tests::gateway::spawn_gateway;
use socialgraph_integration_tests::messages::{message_config, spawn_message};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schemathesis_finds_no_server_error_and_no_response_off_the_document() -> anyhow::Result<()> {
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/schemathesis");
    anyhow::ensure!(tool.exists(), "{} is missing: run `make deps` (it installs scripts/requirements-dev.txt into .venv)", tool.display());
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    // message-svc on the mesh's database, behind the gateway's message routes.
    let mut message = message_config(&mesh.db.url, &socialgraph_testkit::unique("sg.message.test."));
    message.kafka.account_topic = socialgraph_integration_tests::account_topic_of(&mesh.topics.relation);
    let message = spawn_message(message).await?;
    let gw = spawn_gateway(&mesh, |c| c.upstream.message_url = format!("http://{}", message.addr)).await?;
    let report = std::env::temp_dir().join(format!("sg-schemathesis-{}", std::process::id()));
    // One worker: schemathesis 4.32's shared generation cache is not safe across workers (a
    // KeyError inside it was seen under load), and one worker makes the run repeatable.
    let mut command = std::process::Command::new(&tool);
    command
        .args(["run", &format!("{}/openapi.json", gw.base)])
        .args(["--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"])
        .args(["--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "20261202", "--workers", "1"])
        .args(["--generation-database", "none", "--request-timeout", "20", "--no-color", "--max-failures", "20"])
        .arg("--report-dir")
        .arg(&report)
        .env("PYTHONUNBUFFERED", "1");
    // The mesh and the gateway run on this runtime's workers while schemathesis runs.
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    let _ = std::fs::remove_dir_all(&report);
    assert!(
        output.status.success(),
        "schemathesis found failures (exit {:?}):\n{stdout}\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    let n = socialgraph_httpapi::routes(&socialgraph_httpapi::pool()?)?.len();
    assert!(stdout.contains(&format!("{n} selected / {n} total")), "every one of the {n} operations was tested:\n{stdout}");
    gw.stop().await?;
    message.stop().await?;
    mesh.stop().await
}
