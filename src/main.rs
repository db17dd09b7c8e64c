use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn,sled=warn".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = lodestar::cli::run(lodestar::cli::Cli::parse()).await {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}
