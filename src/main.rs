#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = lodestar::cli::parse();
    lodestar::logging::init(cli.log_format());
    if !cli.is_daemon() {
        lodestar::cli::exit_quietly_on_closed_pipe();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("starting the tokio runtime");
    if let Err(e) = runtime.block_on(lodestar::cli::run(cli)) {
        eprintln!("{e:#}");
        std::process::exit(1);
    }
}
