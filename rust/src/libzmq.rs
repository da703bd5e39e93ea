//! The few libzmq calls the crate makes, bound here so that the crate decides how libzmq is linked.
//!
//! The `zmq` crate's `zmq-sys` always compiles its vendored libzmq, without libsodium and so without
//! CURVE, in every project that depends on it; only a `.cargo/config.toml` override inside the
//! building project stops that, and a dependent never has ours. So `build.rs` links the system's
//! libzmq (found by pkg-config), or with the `vendored` feature compiles one with libsodium, and
//! this module declares the calls the crate uses (zmq.h of libzmq 4.3) behind a small safe API:
//! a socket, its options, multipart sends and receives that never block, its monitor, and Z85.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::os::fd::RawFd;
use std::sync::OnceLock;

// zmq.h, libzmq 4.3: socket types, options, flags and monitor events.
pub(crate) const PAIR: c_int = 0;
pub(crate) const DEALER: c_int = 5;
const RCVMORE: c_int = 13;
const FD: c_int = 14;
const EVENTS: c_int = 15;
const LINGER: c_int = 17;
const SNDHWM: c_int = 23;
const RCVHWM: c_int = 24;
const IMMEDIATE: c_int = 39;
const CURVE_PUBLICKEY: c_int = 48;
const CURVE_SECRETKEY: c_int = 49;
const CURVE_SERVERKEY: c_int = 50;
const HEARTBEAT_IVL: c_int = 75;
const HEARTBEAT_TIMEOUT: c_int = 77;
const DONTWAIT: c_int = 1;
const SNDMORE: c_int = 2;
const POLLIN: c_int = 1;

/// libzmq's socket monitor events (`ZMQ_EVENT_*`).
pub(crate) mod event {
    pub const CONNECTED: u16 = 0x0001;
    pub const CONNECT_RETRIED: u16 = 0x0004;
    pub const DISCONNECTED: u16 = 0x0200;
    pub const HANDSHAKE_FAILED_NO_DETAIL: u16 = 0x0800;
    pub const HANDSHAKE_SUCCEEDED: u16 = 0x1000;
    pub const HANDSHAKE_FAILED_PROTOCOL: u16 = 0x2000;
    pub const HANDSHAKE_FAILED_AUTH: u16 = 0x4000;
}

/// `zmq_msg_t`: 64 opaque bytes, aligned to a pointer (zmq.h insists, for sparc64 and aarch64).
#[repr(C, align(8))]
struct Message([u8; 64]);

// Linked by build.rs: the system's libzmq, or the vendored one.
extern "C" {
    fn zmq_ctx_new() -> *mut c_void;
    fn zmq_socket(context: *mut c_void, kind: c_int) -> *mut c_void;
    fn zmq_close(socket: *mut c_void) -> c_int;
    fn zmq_setsockopt(socket: *mut c_void, option: c_int, value: *const c_void, len: usize) -> c_int;
    fn zmq_getsockopt(socket: *mut c_void, option: c_int, value: *mut c_void, len: *mut usize) -> c_int;
    fn zmq_connect(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    fn zmq_socket_monitor(socket: *mut c_void, endpoint: *const c_char, events: c_int) -> c_int;
    fn zmq_send(socket: *mut c_void, buf: *const c_void, len: usize, flags: c_int) -> c_int;
    fn zmq_msg_init(msg: *mut Message) -> c_int;
    fn zmq_msg_recv(msg: *mut Message, socket: *mut c_void, flags: c_int) -> c_int;
    fn zmq_msg_data(msg: *mut Message) -> *mut c_void;
    fn zmq_msg_size(msg: *const Message) -> usize;
    fn zmq_msg_close(msg: *mut Message) -> c_int;
    fn zmq_errno() -> c_int;
    fn zmq_strerror(errnum: c_int) -> *const c_char;
    fn zmq_has(capability: *const c_char) -> c_int;
    fn zmq_curve_keypair(public: *mut c_char, secret: *mut c_char) -> c_int;
    fn zmq_z85_decode(dest: *mut u8, string: *const c_char) -> *mut u8;
}

/// A failed libzmq call: its errno and libzmq's words for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZmqError {
    pub errno: i32,
    pub message: String,
}

impl ZmqError {
    fn last() -> ZmqError {
        // SAFETY: both calls only read libzmq's thread-local errno and its static message table.
        let errno = unsafe { zmq_errno() };
        let message = unsafe { CStr::from_ptr(zmq_strerror(errno)) }.to_string_lossy().into_owned();
        ZmqError { errno, message }
    }
}

impl fmt::Display for ZmqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ZmqError {}

fn check(rc: c_int) -> Result<(), ZmqError> {
    if rc == -1 {
        Err(ZmqError::last())
    } else {
        Ok(())
    }
}

/// The process's one libzmq context (thread-safe, as libzmq documents it; never terminated, so no
/// call can hang on a socket left open at exit).
struct Context(*mut c_void);
// SAFETY: a libzmq context may be used from any thread at once.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

fn context() -> Result<*mut c_void, ZmqError> {
    static CONTEXT: OnceLock<Option<Context>> = OnceLock::new();
    // SAFETY: zmq_ctx_new has no preconditions; a null return is a failure, kept as None.
    let ctx = CONTEXT.get_or_init(|| {
        let raw = unsafe { zmq_ctx_new() };
        (!raw.is_null()).then_some(Context(raw))
    });
    ctx.as_ref().map(|c| c.0).ok_or_else(ZmqError::last)
}

/// Whether the linked libzmq can encrypt with CURVE (it was built with libsodium).
pub(crate) fn has_curve() -> bool {
    // SAFETY: a NUL-terminated capability name.
    unsafe { zmq_has(c"curve".as_ptr()) == 1 }
}

/// A libzmq socket, used by one task at a time (libzmq sockets may move between threads).
pub(crate) struct Socket(*mut c_void);
// SAFETY: libzmq allows a socket to migrate between threads with a full memory barrier in between,
// which moving a value between tokio's threads provides; it is never shared (`Socket` is not Sync).
unsafe impl Send for Socket {}

impl Socket {
    pub fn new(kind: c_int) -> Result<Socket, ZmqError> {
        let ctx = context()?;
        // SAFETY: a live context; a null return is a failure.
        let raw = unsafe { zmq_socket(ctx, kind) };
        if raw.is_null() {
            Err(ZmqError::last())
        } else {
            Ok(Socket(raw))
        }
    }

    fn set_bytes(&self, option: c_int, value: &[u8]) -> Result<(), ZmqError> {
        // SAFETY: the pointer and length describe `value`, which outlives the call.
        check(unsafe { zmq_setsockopt(self.0, option, value.as_ptr().cast(), value.len()) })
    }

    fn set_int(&self, option: c_int, value: c_int) -> Result<(), ZmqError> {
        self.set_bytes(option, &value.to_ne_bytes())
    }

    pub fn set_linger(&self, ms: i32) -> Result<(), ZmqError> {
        self.set_int(LINGER, ms)
    }

    pub fn set_sndhwm(&self, n: i32) -> Result<(), ZmqError> {
        self.set_int(SNDHWM, n)
    }

    pub fn set_rcvhwm(&self, n: i32) -> Result<(), ZmqError> {
        self.set_int(RCVHWM, n)
    }

    pub fn set_immediate(&self, on: bool) -> Result<(), ZmqError> {
        self.set_int(IMMEDIATE, c_int::from(on))
    }

    pub fn set_heartbeat(&self, interval_ms: i32, timeout_ms: i32) -> Result<(), ZmqError> {
        self.set_int(HEARTBEAT_IVL, interval_ms)?;
        self.set_int(HEARTBEAT_TIMEOUT, timeout_ms)
    }

    /// Encrypt with CURVE to the server whose public key (32 bytes) is given, as a fresh client key.
    pub fn set_curve_client(&self, server_key: &[u8]) -> Result<(), ZmqError> {
        let mut public = [0 as c_char; 41];
        let mut secret = [0 as c_char; 41];
        // SAFETY: libzmq writes 40 Z85 characters and a NUL into each 41-byte buffer.
        check(unsafe { zmq_curve_keypair(public.as_mut_ptr(), secret.as_mut_ptr()) })?;
        let as_bytes = |text: &[c_char; 41]| text[..40].iter().map(|&c| c as u8).collect::<Vec<u8>>();
        self.set_bytes(CURVE_SERVERKEY, server_key)?;
        // A 40-byte value is read as Z85 text: libzmq accepts a key either way.
        self.set_bytes(CURVE_PUBLICKEY, &as_bytes(&public))?;
        self.set_bytes(CURVE_SECRETKEY, &as_bytes(&secret))
    }

    fn get_int(&self, option: c_int) -> Result<c_int, ZmqError> {
        let mut value: c_int = 0;
        let mut len = std::mem::size_of::<c_int>();
        // SAFETY: the buffer is a c_int and `len` says so; libzmq writes at most `len` bytes.
        check(unsafe { zmq_getsockopt(self.0, option, std::ptr::from_mut(&mut value).cast(), &mut len) })?;
        Ok(value)
    }

    /// The descriptor that signals a change of the socket's state (owned by libzmq).
    pub fn fd(&self) -> Result<RawFd, ZmqError> {
        self.get_int(FD)
    }

    /// Whether a message is waiting to be read (asking also re-arms the descriptor).
    pub fn readable(&self) -> bool {
        self.get_int(EVENTS).is_ok_and(|events| events & POLLIN != 0)
    }

    pub fn connect(&self, endpoint: &str) -> Result<(), ZmqError> {
        let endpoint = CString::new(endpoint)
            .map_err(|_| ZmqError { errno: 0, message: "the address holds a NUL byte".into() })?;
        // SAFETY: a NUL-terminated endpoint that outlives the call.
        check(unsafe { zmq_connect(self.0, endpoint.as_ptr()) })
    }

    /// Publish this socket's `events` on a PAIR endpoint `inproc://...`.
    pub fn monitor(&self, endpoint: &str, events: i32) -> Result<(), ZmqError> {
        let endpoint = CString::new(endpoint)
            .map_err(|_| ZmqError { errno: 0, message: "the endpoint holds a NUL byte".into() })?;
        // SAFETY: a NUL-terminated endpoint that outlives the call.
        check(unsafe { zmq_socket_monitor(self.0, endpoint.as_ptr(), events) })
    }

    /// Stop the monitor (libzmq's documented null endpoint).
    pub fn stop_monitor(&self) {
        // SAFETY: a live socket; a null endpoint stops its monitor.
        unsafe { zmq_socket_monitor(self.0, std::ptr::null(), 0) };
    }

    /// Send one multipart message without blocking; false when libzmq refused it (no connection
    /// up with `ZMQ_IMMEDIATE`, a full queue). libzmq sends a message's frames atomically: once the
    /// first frame is taken the rest are too.
    pub fn send_multipart(&self, frames: &[Vec<u8>]) -> bool {
        for (i, frame) in frames.iter().enumerate() {
            let flags = DONTWAIT | if i + 1 < frames.len() { SNDMORE } else { 0 };
            // SAFETY: the pointer and length describe `frame`; libzmq copies it.
            if unsafe { zmq_send(self.0, frame.as_ptr().cast(), frame.len(), flags) } == -1 {
                return false;
            }
        }
        true
    }

    /// The next whole message, if one is waiting (never blocks).
    pub fn recv_multipart(&self) -> Option<Vec<Vec<u8>>> {
        let mut frames = Vec::new();
        loop {
            let mut msg = Message([0; 64]);
            // SAFETY: `msg` is a properly aligned zmq_msg_t, initialised before the receive and
            // closed after its bytes are copied out.
            let frame = unsafe {
                zmq_msg_init(&mut msg);
                if zmq_msg_recv(&mut msg, self.0, DONTWAIT) == -1 {
                    zmq_msg_close(&mut msg);
                    // Frames of one message arrive together: only the first can be missing.
                    return None;
                }
                let len = zmq_msg_size(&msg);
                let data = zmq_msg_data(&mut msg).cast::<u8>();
                let bytes = if len == 0 { Vec::new() } else { std::slice::from_raw_parts(data, len).to_vec() };
                zmq_msg_close(&mut msg);
                bytes
            };
            frames.push(frame);
            if self.get_int(RCVMORE).unwrap_or(0) == 0 {
                return Some(frames);
            }
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the socket is open and never used after this.
        unsafe { zmq_close(self.0) };
    }
}

/// Decode 40 Z85 characters into 32 bytes; None when they are not Z85.
pub(crate) fn z85_decode(text: &str) -> Option<Vec<u8>> {
    if text.is_empty() || text.len() % 5 != 0 || !text.is_ascii() {
        return None;
    }
    let text = CString::new(text).ok()?;
    let mut out = vec![0u8; text.as_bytes().len() * 4 / 5];
    // SAFETY: the output holds 4 bytes for every 5 characters, as zmq_z85_decode writes.
    let ok = unsafe { zmq_z85_decode(out.as_mut_ptr(), text.as_ptr()) };
    (!ok.is_null()).then_some(out)
}
