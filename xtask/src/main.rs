//! Project chores: `cargo xtask shaders` regenerates the prebuilt SPIR-V.

fn main() -> anyhow::Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "shaders" => anyhow::bail!("no shaders yet"),
        _ => {
            eprintln!("usage: cargo xtask shaders");
            std::process::exit(2)
        }
    }
}
