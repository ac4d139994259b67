//! Generates the OpenAPI document from the proto's google.api.http annotations at build time
//! (into OUT_DIR/openapi.json, served at /openapi.json).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = socialgraph_httpapi::pool()?;
    let routes = socialgraph_httpapi::routes(&pool)?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("openapi.json"), socialgraph_httpapi::openapi::document(&routes))?;
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}
