//! `strata worker`: the arguments and the process around a [`Worker`].
//!
//! A user who builds a worker binary with their own kernels calls
//! [`run`] with a registry holding them ([`run_with`] to open the chip
//! too).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use strata_chip_runtime::{Device, Registry};
use tracing::info;

use crate::config::{Auth, Endpoint, TlsFiles, WorkerConfig};
use crate::orphan::DriverWatch;
use crate::{Worker, WorkerError};

/// Options of `strata worker`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  strata worker --listen unix:/run/strata/chip0.sock
  strata worker --chip 1 --device sim:mem=2GiB,lanes=2 --listen unix:/tmp/chip1.sock --ready-file /tmp/chip1.ready
  strata worker --chip 1 --device cuda:1,mem=8GiB --listen unix:/tmp/gpu1.sock
  strata worker --listen tcp:0.0.0.0:7420 --token-file /etc/strata/token
  strata worker --listen tcp:0.0.0.0:7420 --tls-cert w.pem --tls-key w.key --tls-client-ca ca.pem")]
pub struct WorkerArgs {
    /// Which chip this worker owns (reported to the orchestrator).
    #[arg(long, default_value_t = 0)]
    pub chip: u32,
    /// The chip: sim[:mem=SIZE,mode=staged|unified,lanes=N,run=SIZE,scratch=SIZE]
    /// (a simulated chip) or cuda:N[,mem=SIZE,run=SIZE,scratch=SIZE,streams=N,prefetch=on|off]
    /// (GPU N; plain cuda is GPU 0). cuda:all names every GPU and is for drivers that
    /// start one worker per GPU; a worker owns one.
    #[arg(long, default_value = "sim")]
    pub device: String,
    /// Where to serve: unix:PATH (mode 0600, same-uid clients only) or tcp:HOST:PORT.
    #[arg(long)]
    pub listen: Endpoint,
    /// The fd side channel's socket (default: the listen path + ".fd").
    #[arg(long)]
    pub fd_socket: Option<PathBuf>,
    /// File holding the bearer token TCP clients must send.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// TLS certificate chain (PEM) for a TCP listener; needs --tls-key and --tls-client-ca.
    #[arg(long, requires_all = ["tls_key", "tls_client_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Allow a TCP listener without token or TLS (anyone who reaches it can run tasks).
    #[arg(long)]
    pub insecure: bool,
    /// Also write the ready line, as JSON, to this file once serving.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Exit at once when stdin reaches end of file, whatever the running
    /// kernels are doing, after removing this worker's sockets and ready
    /// file: a driver that spawns workers holds their stdin, so they go
    /// when it goes, even if it is killed.
    #[arg(long)]
    pub exit_with_stdin: bool,
    /// The private folder of the driver that spawned this worker (with
    /// --exit-with-stdin): when the driver is gone the worker also removes
    /// its log chipN.log there, and the folder when it is the last one
    /// out.
    #[arg(long, requires = "exit_with_stdin")]
    pub driver_dir: Option<PathBuf>,
    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, default_value_t = strata_proto::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// End a session whose client opened no task stream this many
    /// milliseconds after its handshake.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub session_grace_ms: u64,
    /// Close a connection whose peer has not answered a ping for this many
    /// milliseconds (pinged every half of it), ending its sessions.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(2..))]
    pub peer_timeout_ms: u64,
    /// Never offer local clients the shared-memory ring: their tasks and
    /// completions travel on the gRPC stream.
    #[arg(long)]
    pub no_ring: bool,
    /// Never offer TCP clients a data connection: large view bytes then
    /// travel in gRPC messages and the `Stage` and `Fetch` calls. (A
    /// worker with TLS never offers one: its frames would not be
    /// encrypted.)
    #[arg(long, conflicts_with = "data_port")]
    pub no_data_port: bool,
    /// The TCP port of the data connection (on the listen address); 0
    /// lets the system pick one. The handshake tells drivers which.
    #[arg(long, default_value_t = 0)]
    pub data_port: u16,
}

impl WorkerArgs {
    /// The configuration these options describe.
    ///
    /// # Errors
    /// When the token file cannot be read or is empty.
    pub fn config(&self) -> Result<WorkerConfig, WorkerError> {
        let token = match &self.token_file {
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .map_err(|e| WorkerError::Config(format!("token file {}: {e}", p.display())))?;
                let t = t.trim().to_owned();
                if t.is_empty() {
                    return Err(WorkerError::Config(format!(
                        "token file {} is empty",
                        p.display()
                    )));
                }
                Some(t)
            }
            None => None,
        };
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: ca.clone(),
            }),
            _ => None,
        };
        let mut c = WorkerConfig::new(self.listen.clone());
        c.chip_id = self.chip;
        c.device_spec = self.device.clone();
        c.fd_socket = self.fd_socket.clone();
        c.auth = Auth {
            token,
            tls,
            insecure: self.insecure,
        };
        c.max_message_bytes = self.max_message_bytes;
        c.session_grace = std::time::Duration::from_millis(self.session_grace_ms);
        c.peer_timeout = std::time::Duration::from_millis(self.peer_timeout_ms);
        c.ring = !self.no_ring;
        c.data_port = (!self.no_data_port).then_some(self.data_port);
        Ok(c)
    }
}

/// Runs a worker until SIGTERM or SIGINT (or, with `--exit-with-stdin`,
/// until stdin closes, when it removes its files and exits 0 at once):
/// logs to stderr (`RUST_LOG`, default `info`), prints one ready line to
/// stdout once serving, exits 0 after a clean shutdown and 1 when it
/// cannot start.
pub fn run(args: WorkerArgs, kernels: Registry) -> ExitCode {
    run_with(args, kernels, strata_chip_runtime::open)
}

/// [`run`], with the chip opened by `open` from `--device` instead of by
/// [`strata_chip_runtime::open`]: for a worker binary whose chip is one of
/// its own, or a chip wrapped (a failure of `open` is the worker's
/// start failure, on one line, as for a chip that is not there).
pub fn run_with(
    args: WorkerArgs,
    kernels: Registry,
    open: impl FnOnce(&str) -> Result<Arc<dyn Device>, strata_chip_runtime::Error>,
) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-worker")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("strata worker: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let chip = match open(&args.device) {
        Ok(chip) => chip,
        Err(source) => {
            eprintln!(
                "strata worker: {}",
                WorkerError::Device {
                    chip: args.chip,
                    source
                }
            );
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args, kernels, chip)) {
        Ok(()) => ExitCode::SUCCESS,
        // One line, on stderr: the log's own line would say it twice.
        Err(e) => {
            eprintln!("strata worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    args: WorkerArgs,
    kernels: Registry,
    chip: Arc<dyn Device>,
) -> Result<(), WorkerError> {
    let config = args.config()?;
    // Watching from the start: a driver gone while the worker starts up
    // is noticed as soon as it serves.
    let driver = if args.exit_with_stdin {
        Some(DriverWatch::start().map_err(WorkerError::StdinWatch)?)
    } else {
        None
    };
    let bound = Worker::new(config)
        .kernels(kernels)
        .chip(chip)
        .bind()
        .await?;
    let fd = bound
        .fd_socket()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let line = format!(
        "strata worker ready: chip={} listen={} fd={} device={} pid={} data={}",
        args.chip,
        bound.endpoint(),
        if fd.is_empty() { "-" } else { &fd },
        bound.device_spec(),
        std::process::id(),
        bound
            .data_port()
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
    );
    if let Some(path) = &args.ready_file {
        let json = serde_json::json!({
            "chip": args.chip,
            "listen": bound.endpoint().to_string(),
            "fd_socket": fd,
            "device": bound.device_spec(),
            "pid": std::process::id(),
            "data_port": bound.data_port(),
        });
        std::fs::write(path, json.to_string())
            .map_err(|e| WorkerError::Config(format!("ready file {}: {e}", path.display())))?;
    }
    if let Some(driver) = &driver {
        let mut files: Vec<PathBuf> = Vec::new();
        if let Endpoint::Unix(p) = bound.endpoint() {
            files.push(p.clone());
        }
        files.extend(bound.fd_socket().map(std::path::Path::to_path_buf));
        files.extend(args.ready_file.clone());
        driver.serving(files, args.driver_dir.as_deref(), args.chip);
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    info!(ready = %line, "serving");
    bound.serve(terminate()).await
}

/// Resolves on SIGTERM or SIGINT.
async fn terminate() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
