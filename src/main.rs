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
        // A replica of the wrong version for its cluster: not worth a restart.
        let refused = e.downcast_ref::<lodestar::node::version::Refused>().is_some();
        std::process::exit(if refused { lodestar::node::version::REFUSED_EXIT_CODE } else { 1 });
    }
}
