use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    lodestar::logging::init("info,openraft=warn,sled=warn");
    if let Err(e) = lodestar::cli::run(lodestar::cli::Cli::parse()).await {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}
