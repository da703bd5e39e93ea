//! A ZeroMQ DEALER socket (real libzmq, through `src/libzmq.rs`) on the tokio runtime.
//!
//! libzmq's sockets are not thread-safe and its calls would block, so a socket lives inside one
//! tokio task, always used with `DONTWAIT`, and the task sleeps on the socket's `ZMQ_FD` through
//! [`AsyncFd`]. That descriptor is edge-triggered and only says "something changed": a wake-up
//! can stand for many messages, and a send can consume the signal of a message that arrived
//! meanwhile. So the owner drains the socket until `EAGAIN` after every wake-up, and asks
//! `ZMQ_EVENTS` after sending before it sleeps again ([`Dealer::has_input`]).
//!
//! With a socket monitor the task also learns of each completed handshake: that is how a client
//! knows it reached a (possibly restarted) broker and must re-send what is outstanding, and how a
//! worker knows to register — and of each failed attempt, from which `src/link.rs` tells when
//! waiting for the broker is pointless.
//!
//! One DEALER connects to every address of a broker (its primary, then its standbys) with
//! `ZMQ_IMMEDIATE`: libzmq queues messages only on a connection whose handshake completed, so only
//! the broker that serves ever gets them (a standby binds nothing until it takes over). While no
//! connection is up a send is refused (`EAGAIN`) instead of waiting in a queue for an address that
//! may never answer: the owner keeps such messages and sends them on the next handshake.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::{Error, Result};
use crate::libzmq::{self, Socket, ZmqError};
use crate::link::{self, Event, Links};

/// Queued messages per socket each way before sends refuse (`EAGAIN`) and receives push back.
pub(crate) const HIGH_WATER_MARK: i32 = 100_000;

/// A libzmq socket's notification descriptor (owned by libzmq, never closed here).
struct ZmqFd(RawFd);

impl AsRawFd for ZmqFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

fn watch(fd: RawFd) -> std::io::Result<AsyncFd<ZmqFd>> {
    // SAFETY: the descriptor is libzmq's, open for as long as its socket is; every AsyncFd made here
    // lives in a `Signals` that its `Dealer` drops before the socket (field order).
    unsafe { AsyncFd::register_with_interest(ZmqFd(fd), Interest::READABLE) }.map_err(|e| e.into())
}

/// How to open a DEALER.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// The broker's CURVE public key (32 bytes): encrypt the connection.
    pub curve_server_key: Option<Vec<u8>>,
    /// Watch for completed handshakes.
    pub monitor: bool,
    /// ZMTP heartbeats, so a broker whose host vanished is noticed (milliseconds: interval, timeout).
    pub heartbeat: Option<(i32, i32)>,
}

/// A DEALER socket and its descriptors, used by the one task that owns it.
pub(crate) struct Dealer {
    /// The descriptors to sleep on (kept apart: libzmq sockets are `Send` but not `Sync`, and only
    /// these are borrowed across an await). Declared first so they are deregistered before the
    /// sockets that own the descriptors close.
    pub signals: Signals,
    sock: Socket,
    monitor: Option<Socket>,
    /// Each address's link, by the monitor: up from its handshake to its disconnection, and why it fails.
    links: RefCell<Links>,
}

/// The notification descriptors of a socket and its monitor.
pub(crate) struct Signals {
    fd: AsyncFd<ZmqFd>,
    monitor: Option<AsyncFd<ZmqFd>>,
}

/// A socket of this side that cannot be made or set up to reach `address`.
fn zmq_error(address: &str, what: &str, e: impl std::fmt::Display) -> Error {
    Error::connection(address, format!("{what} for the broker at {address}: {e}"))
}

impl Dealer {
    /// A DEALER connected (in the background: libzmq connects and reconnects by itself) to each of
    /// `addresses`, in order. InvalidArgument for an address libzmq cannot use. Must be called
    /// inside a tokio runtime.
    pub fn connect(addresses: &[String], options: &Options) -> Result<Dealer> {
        if options.curve_server_key.is_some() && !libzmq::has_curve() {
            return Err(Error::connection(
                addresses.join(" or "),
                "this program's libzmq was built without CURVE (libsodium), so it cannot encrypt: link the \
                 system's libzmq (the crate's default) or build with the crate's `vendored` feature, which \
                 compiles libzmq with libsodium"
                    .to_string(),
            ));
        }
        let at = addresses.join(" or ");
        let zmq_error = |what: &str, e: ZmqError| zmq_error(&at, what, e);
        let sock = Socket::new(libzmq::DEALER).map_err(|e| zmq_error("cannot make a socket", e))?;
        let setup = || -> std::result::Result<(), ZmqError> {
            sock.set_linger(0)?;
            sock.set_sndhwm(HIGH_WATER_MARK)?;
            sock.set_rcvhwm(HIGH_WATER_MARK)?;
            // Queue only on connections whose handshake completed: of a primary and its standbys,
            // only the one that serves takes a connection.
            sock.set_immediate(true)?;
            if let Some((interval, timeout)) = options.heartbeat {
                sock.set_heartbeat(interval, timeout)?;
            }
            if let Some(server_key) = &options.curve_server_key {
                sock.set_curve_client(server_key)?;
            }
            Ok(())
        };
        setup().map_err(|e| zmq_error("cannot set up the socket", e))?;
        let monitor = if options.monitor {
            static MONITORS: AtomicUsize = AtomicUsize::new(0);
            let endpoint =
                format!("inproc://cronoq-monitor-{}-{}", std::process::id(), MONITORS.fetch_add(1, Ordering::Relaxed));
            sock.monitor(&endpoint, link::events()).map_err(|e| zmq_error("cannot monitor the socket", e))?;
            let pair = Socket::new(libzmq::PAIR).map_err(|e| zmq_error("cannot make a socket", e))?;
            pair.set_linger(0).map_err(|e| zmq_error("cannot set up the monitor", e))?;
            // No limit on the events waiting to be read: libzmq's I/O thread sends them blocking,
            // and would hang every socket of the process on a full queue.
            pair.set_rcvhwm(0).map_err(|e| zmq_error("cannot set up the monitor", e))?;
            pair.connect(&endpoint).map_err(|e| zmq_error("cannot connect the monitor", e))?;
            let fd = pair.fd().map_err(|e| zmq_error("no descriptor for the monitor", e))?;
            let afd = watch(fd).map_err(|e| self::zmq_error(&at, "cannot watch the monitor", e))?;
            Some((pair, afd))
        } else {
            None
        };
        let (monitor, mfd) = match monitor {
            Some((pair, afd)) => (Some(pair), Some(afd)),
            None => (None, None),
        };
        for address in addresses {
            sock.connect(address)
                .map_err(|e| Error::InvalidArgument(format!("cannot connect to broker address {address:?}: {e}")))?;
        }
        let raw = sock.fd().map_err(|e| zmq_error("no descriptor for the socket", e))?;
        let fd = watch(raw).map_err(|e| self::zmq_error(&at, "cannot watch the socket", e))?;
        let links = RefCell::new(Links::new(addresses, options.curve_server_key.is_some()));
        Ok(Dealer { sock, monitor, signals: Signals { fd, monitor: mfd }, links })
    }

    /// The next whole message, if one is waiting (never blocks).
    pub fn try_recv(&self) -> Option<Vec<Vec<u8>>> {
        self.sock.recv_multipart()
    }

    /// Send one message without blocking; false when no connection is up (`ZMQ_IMMEDIATE`) or the
    /// one that is has a full send queue.
    pub fn send(&self, frames: &[Vec<u8>]) -> bool {
        self.sock.send_multipart(frames)
    }

    /// Whether a message is waiting (asks libzmq, which also re-arms the descriptor).
    pub fn has_input(&self) -> bool {
        self.sock.readable() || self.monitor.as_ref().is_some_and(Socket::readable)
    }

    /// How many handshakes completed since the last call; also keeps [`is_up`](Self::is_up),
    /// [`hopeless`](Self::hopeless) and [`silence`](Self::silence) current.
    pub fn handshakes(&self) -> usize {
        let Some(monitor) = &self.monitor else { return 0 };
        let mut n = 0;
        let mut links = self.links.borrow_mut();
        while let Some(frames) = monitor.recv_multipart() {
            let Some(event) = Event::parse(&frames) else { continue };
            if event.is(libzmq::event::HANDSHAKE_SUCCEEDED) {
                n += 1;
            }
            links.observe(&event, Instant::now());
        }
        n
    }

    /// Whether some connection's handshake completed and it has not ended since, as far as the
    /// monitor has said (always false without a monitor).
    pub fn is_up(&self) -> bool {
        self.links.borrow().up()
    }

    /// Why waiting for this broker is pointless now (nothing ever took the connection, or the CURVE
    /// handshake cannot succeed), as a sentence; None while it may yet answer (src/link.rs).
    pub fn hopeless(&self) -> Option<String> {
        self.links.borrow().hopeless(Instant::now())
    }

    /// Why serving cannot start at all (no address ever reached, a CURVE mistake at each), or None.
    pub fn fatal(&self) -> Option<String> {
        self.links.borrow().fatal()
    }

    /// Why `what` (a request that got no reply) came to nothing, by the state of the links.
    pub fn silence(&self, what: &str) -> String {
        self.links.borrow().silence(what)
    }
}

impl Signals {
    /// Wait until the socket (or its monitor) signals a change. Spurious wake-ups are possible:
    /// drain with `try_recv` and `handshakes` afterwards.
    pub async fn changed(&self) {
        let socket = async {
            if let Ok(mut guard) = self.fd.readable().await {
                guard.clear_ready();
            }
        };
        match &self.monitor {
            None => socket.await,
            Some(mfd) => {
                let monitor = async {
                    if let Ok(mut guard) = mfd.readable().await {
                        guard.clear_ready();
                    }
                };
                tokio::select! {
                    _ = socket => {}
                    _ = monitor => {}
                }
            }
        }
    }
}

impl Drop for Dealer {
    fn drop(&mut self) {
        if self.monitor.is_some() {
            // Stop the monitor before its PAIR goes: libzmq's I/O thread sends events blocking, and
            // one it sends as the socket closes (a connection ending) to a PAIR nobody reads would
            // stall every socket of the process for good. (`monitor("", 0)` did not stop it: libzmq
            // refuses the empty endpoint.)
            self.sock.stop_monitor();
        }
    }
}

/// A broker's CURVE public key, given as its 40 Z85 characters or as the path of a `NAME.key`
/// certificate file (as `cronoq keygen` writes it); 32 bytes.
/// The file is read on tokio's blocking pool, never on the runtime's threads.
pub(crate) async fn curve_public_key(value: &str) -> Result<Vec<u8>> {
    let given = value.to_string();
    tokio::task::spawn_blocking(move || read_curve_public_key(&given))
        .await
        .unwrap_or_else(|e| Err(Error::InvalidArgument(format!("reading the broker's public key failed: {e}"))))
}

fn read_curve_public_key(value: &str) -> Result<Vec<u8>> {
    let text = if value.len() == 40 && !std::path::Path::new(value).exists() {
        value.to_string()
    } else {
        let file = std::fs::read_to_string(value).map_err(|e| {
            Error::InvalidArgument(format!(
                "the broker's public key must be 40 Z85 characters or a NAME.key file; {value:?}: {e}"
            ))
        })?;
        file.lines()
            .filter_map(|line| line.trim().strip_prefix("public-key"))
            .filter_map(|rest| rest.trim().strip_prefix('='))
            .map(|rest| rest.trim().trim_matches('"').to_string())
            .next()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{value} holds no public-key line: point at the NAME.key file"))
            })?
    };
    let key = libzmq::z85_decode(&text)
        .ok_or_else(|| Error::InvalidArgument(format!("the broker's public key {text:?} is not Z85")))?;
    if key.len() != 32 {
        return Err(Error::InvalidArgument(format!(
            "the broker's public key must decode to 32 bytes, got {}",
            key.len()
        )));
    }
    Ok(key)
}
