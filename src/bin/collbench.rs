//! `collbench`: see `topoccl::collbench`.

use clap::Parser;

fn main() {
    let args = topoccl::collbench::Args::parse();
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = topoccl::collbench::run(&args, &mut stdout) {
        eprintln!("collbench: {e}");
        std::process::exit(1);
    }
}
