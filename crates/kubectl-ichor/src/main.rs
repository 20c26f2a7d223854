//! `kubectl-ichor`: the kubectl plugin binary (`kubectl ichor ...`). Parses the command line,
//! runs the command, prints its output; errors go to stderr with exit code 1, or 2 for usage
//! errors.

use std::io::Write as _;
use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match kubectl_ichor::cli::parse(&args) {
        Ok(invocation) => kubectl_ichor::run(invocation).await,
        Err(error) => Err(error),
    };
    match result {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = stdout.write_all(output.as_bytes());
            let _ = stdout.flush();
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
