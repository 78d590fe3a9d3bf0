//! Command line: parses arguments, sets up logging, calls the library and
//! turns errors into one line and an exit code.

mod allocator;
mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let log_format = args.log_format;
    init_logging(log_format, args.is_daemon());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(cli::run(args));
    // What a command must finish (probes drained, runs stored) is done when
    // `run` returns; a blocking call still running then (a GPU read stuck
    // in its driver) must not keep a stopped process from exiting.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(code) => code,
        // Standard output closed by its reader (`export | head`): the
        // reader had what it wanted.
        Err(e) if closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, no backtrace. Library
            // errors carry their causes in their messages and do not chain
            // them, so `{:#}` prints each cause once. Written, not
            // `eprintln!`ed: a closed standard error must not panic.
            match log_format {
                cli::LogFormat::Text => {
                    use std::io::Write;
                    let _ = writeln!(std::io::stderr(), "error: {e:#}");
                }
                // A collector reading JSON lines gets the last one as JSON too.
                cli::LogFormat::Json => tracing::error!("{e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Whether an error came of writing to a pipe its reader closed.
fn closed_pipe(e: &anyhow::Error) -> bool {
    let broken = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().map(|io| io.kind()) == broken
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                == broken
    })
}

/// Logs filtered by `RUST_LOG` (default `info`): the daemon's to standard
/// output, the other commands' to standard error (their results go to
/// standard output).
fn init_logging(format: cli::LogFormat, to_stdout: bool) {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    // The Kubernetes client's watcher warns at every retry of a failed
    // watch; the daemon says each failure once itself (unless asked for
    // the client's own logs by name).
    let quiet = |directives: String| match directives.contains("kube") {
        true => directives,
        false => format!("{directives},kube_runtime=error"),
    };
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|d| tracing_subscriber::EnvFilter::try_new(quiet(d)).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(quiet("info".into())));
    let (writer, terminal) = if to_stdout {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        (BoxMakeWriter::new(std::io::stdout), terminal)
    } else {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        (BoxMakeWriter::new(std::io::stderr), terminal)
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        // Event fields nested under "fields": flattened, the probe target's
        // name would collide with the log target (the module).
        cli::LogFormat::Json => logs.json().init(),
        // Colour codes only for a person at a terminal, never in a file or
        // a log collector's input.
        cli::LogFormat::Text => logs.with_ansi(terminal).init(),
    }
}
