//! A browser client: headless Chromium loads a page (from its own origin) that follows an
//! account through the gateway and shows the follower count; the DOM and the screenshot (read
//! back with tesseract) must both say `followers 1`.

use std::process::Command;

use reqwest::Method;
use socialgraph_integration_tests::Mesh;
use socialgraph_integration_tests::gateway::spawn_gateway;

const PAGE: &str = include_str!("assets/gateway_follow.html");

fn require(tool: &str) -> anyhow::Result<()> {
    let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output()?.status.success();
    anyhow::ensure!(found, "{tool} is not installed: run `make deps` (step browser installs Debian's chromium and tesseract-ocr)");
    Ok(())
}

/// Headless Chromium on `url` with `args` (screenshot or DOM dump), bounded to 90 s.
async fn chromium(url: String, args: Vec<String>) -> anyhow::Result<String> {
    let profile = std::env::temp_dir().join(format!("sg-chromium-{}-{}", std::process::id(), socialgraph_testkit::unique("")));
    let mut command = Command::new("timeout");
    command
        .args(["90", "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--window-size=900,300", "--virtual-time-budget=20000"])
        .args(args)
        .arg(url);
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    let _ = std::fs::remove_dir_all(&profile);
    anyhow::ensure!(output.status.success(), "chromium failed ({:?}): {}", output.status.code(), String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_browser_page_follows_through_the_gateway_and_shows_the_follower_count() -> anyhow::Result<()> {
    require("chromium")?;
    require("tesseract")?;
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let page_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let origin = format!("http://{}", page_listener.local_addr()?);
    let gw = spawn_gateway(&mesh, |c| c.http.cors_allowed_origins = vec![origin.clone()]).await?;
    let page = PAGE.replace("GATEWAY", &gw.base).replace("FOLLOWER", "41").replace("FOLLOWEE", "42");
    let app = axum::Router::new().route("/", axum::routing::get(move || async move { axum::response::Html(page) }));
    let server = tokio::spawn(async move { axum::serve(page_listener, app).await });

    let shot = std::env::temp_dir().join(format!("sg-gateway-{}.png", socialgraph_testkit::unique("")));
    chromium(format!("{origin}/"), vec![format!("--screenshot={}", shot.display())]).await?;
    let ocr = Command::new("tesseract").arg(&shot).arg("stdout").output()?;
    let text = String::from_utf8_lossy(&ocr.stdout).into_owned();
    println!("screenshot {} reads: {text:?}", shot.display());
    assert!(text.split_whitespace().collect::<Vec<_>>().join(" ").contains("followers 1"), "the screenshot shows the count, read back: {text:?}");
    let _ = std::fs::remove_file(&shot);

    // The page's follow is real: the mesh has the edge, and a second load (the follow is
    // idempotent) renders the same text in the DOM.
    let rel = gw.call(Method::GET, "/v1/users/41/relationships/42", None).await?;
    assert_eq!(rel.json["relationship"]["following"], true, "{}", rel.json);
    let dom = chromium(format!("{origin}/"), vec!["--dump-dom".into()]).await?;
    assert!(dom.contains(r#"<div id="out">followers 1</div>"#), "{dom}");

    server.abort();
    gw.stop().await?;
    mesh.stop().await
}
