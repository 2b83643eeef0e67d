//! `collbench`: see `topoccl::collbench`.

use clap::Parser;

fn main() {
    let args = topoccl::collbench::Args::parse();
    let code = {
        let mut stdout = std::io::stdout().lock();
        match topoccl::collbench::run(&args, &mut stdout) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("collbench: {e}");
                1
            }
        }
    };
    std::process::exit(code);
}
