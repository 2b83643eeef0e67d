//! `collbench`: see the `collbench` crate's documentation.

use clap::Parser;

fn main() {
    let args = collbench::Args::parse();
    let code = {
        let mut stdout = std::io::stdout().lock();
        match collbench::run(&args, &mut stdout) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("collbench: {e}");
                1
            }
        }
    };
    std::process::exit(code);
}
