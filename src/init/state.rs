//! The init's whole state, shared by the handlers (each concern adds its methods in its own
//! file: forward.rs, reaping.rs, stop.rs, timers.rs, launch.rs, relay.rs, finish.rs,
//! shim_events.rs, server.rs).

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::signalfd::SignalFd;
use nix::unistd::Pid;

use super::conn::Conn;
use super::reaper::Exit;
use super::runs::Run;
use super::setup::Mode;
use super::shutdown::Timeline;
use super::token;
use crate::config::InitConfig;
use crate::locks::book::Book;
use crate::locks::recorder::Recorder;
use crate::protocol;

/// The controller.
#[derive(Debug)]
pub struct Main {
    /// Its pid, also its process group id.
    pub pid: Pid,
    /// How it ended, once reaped.
    pub exit: Option<Exit>,
    /// Whether its group got a stop signal already (never send it a second SIGTERM by ourselves).
    pub group_stopped: bool,
}

/// Who a reaped pid belonged to.
#[derive(Debug, Clone, Copy)]
pub enum PidOwner {
    /// terraform of run N.
    Terraform(u64),
    /// The lock-recovery helper of run N.
    Recovery(u64),
}

/// The init's whole state.
pub struct Init {
    /// The configuration.
    pub cfg: InitConfig,
    /// PID 1 or subreaper.
    pub mode: Mode,
    /// The one epoll set.
    pub epoll: Epoll,
    /// Signals, blocked in every thread and read here.
    pub sigfd: SignalFd,
    /// The control socket, when shims can use it.
    pub listener: Option<UnixListener>,
    /// The controller.
    pub main: Main,
    /// The shutdown timeline.
    pub timeline: Timeline,
    /// Client connections by id.
    pub conns: HashMap<u64, Conn>,
    /// terraform runs by id.
    pub runs: HashMap<u64, Run>,
    /// Our children other than the controller: whose they are.
    pub pids: HashMap<Pid, PidOwner>,
    /// The next connection id.
    pub next_id: u64,
    /// The next run id.
    pub next_run: u64,
    /// The recorder thread (all storage work), while it runs.
    pub recorder: Option<Recorder>,
    /// This incarnation's lock file, flocked, which every terraform run inherits (the kernel
    /// frees it once the init and every run are gone: the proof a container restart uses).
    pub incarnation_lock: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// What the loop knows about lock-owner records, in memory.
    pub book: Book,
    /// Read buffer for terraform's output.
    pub scratch: Vec<u8>,
}

impl Init {
    /// Registers the signalfd and the listener in a new epoll set.
    pub fn new(
        cfg: InitConfig,
        mode: Mode,
        sigfd: SignalFd,
        listener: Option<UnixListener>,
        recorder: Option<Recorder>,
        book: Book,
        main_pid: Pid,
    ) -> io::Result<Init> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            sigfd.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, token::TOKEN_SIGNALS),
        )?;
        if let Some(l) = &listener {
            epoll.add(
                l.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, token::TOKEN_LISTENER),
            )?;
        }
        if let Some(r) = &recorder {
            epoll.add(
                r.fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, token::TOKEN_RECORDER),
            )?;
        }
        let timeline = Timeline::new(cfg.grace_period, cfg.stop_timeout, cfg.kill_margin);
        Ok(Init {
            cfg,
            mode,
            epoll,
            sigfd,
            listener,
            main: Main {
                pid: main_pid,
                exit: None,
                group_stopped: false,
            },
            timeline,
            conns: HashMap::new(),
            runs: HashMap::new(),
            pids: HashMap::new(),
            next_id: 1,
            next_run: 1,
            recorder,
            incarnation_lock: None,
            book,
            scratch: vec![0u8; protocol::MAX_DATA],
        })
    }
}
