//! tfinit's entry point: which program are we (init, terraform shim, client), then run it.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::exit;

use clap::{CommandFactory, FromArgMatches};

use tfinit::cli::{Cli, Command};
use tfinit::{client, config, init, locks, logging};

fn main() {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let argv0 = argv
        .first()
        .cloned()
        .unwrap_or_else(|| OsString::from("tfinit"));

    // 1. Multi-call: invoked as `terraform` or `tofu` (a symlink on PATH), we are the shim.
    let name = Path::new(&argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or("tfinit");
    if name == "terraform" || name == "tofu" {
        exit(client::shim::main(&argv0, name, argv[1..].to_vec()));
    }
    // 2. The init's hidden lock-recovery helper (re-exec of /proc/self/exe).
    if argv
        .get(1)
        .is_some_and(|a| a == locks::recover::HIDDEN_SUBCOMMAND)
    {
        exit(client::control::recover_helper(&argv[2..]));
    }
    // 3. Everything else: parse the command line (flags win over TFINIT_* variables).
    let matches = Cli::command().get_matches_from(&argv);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let code = match cli.command {
        Some(Command::Terraform { args }) => {
            client::shim::main(OsStr::new("terraform"), "terraform", args)
        }
        Some(Command::Tofu { args }) => client::shim::main(OsStr::new("tofu"), "tofu", args),
        Some(Command::Status) => {
            logging::init_client();
            client::control::status()
        }
        Some(Command::Metrics) => {
            logging::init_client();
            client::control::metrics()
        }
        Some(Command::Drain { wait, timeout }) => {
            logging::init_client();
            client::control::drain(wait, timeout.as_deref())
        }
        Some(Command::Resume) => {
            logging::init_client();
            client::control::resume()
        }
        Some(Command::Cancel {
            run,
            workdir,
            force,
        }) => {
            logging::init_client();
            client::control::cancel(run.as_deref(), workdir.as_deref(), force)
        }
        Some(Command::Recover { dry_run, terraform }) => {
            logging::init_client_at(tracing::Level::INFO);
            client::control::recover_all(dry_run, terraform.as_deref())
        }
        None => run_init(cli, &matches),
    };
    exit(code);
}

/// The init: validate settings, take over signals, start the controller, supervise until done.
fn run_init(cli: Cli, matches: &clap::ArgMatches) -> i32 {
    // Signals first: blocked before anything could start a thread, or the signalfd misses them.
    let signals = match init::signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tfinit: cannot set up signal handling (signalfd): {e}");
            return 1;
        }
    };
    let cfg = match config::InitConfig::from_args(&cli.init, Some(matches)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tfinit: {e}");
            return 2;
        }
    };
    if cli.main.is_empty() {
        eprintln!("tfinit: no command to run: use `tfinit [OPTIONS] -- COMMAND [ARGS...]`, e.g. `tfinit -- /usr/local/bin/provider`");
        return 2;
    }
    logging::init(cfg.log_level, cfg.log_format);
    init::run(cfg, cli.main, signals)
}
