//! How libzmq is linked, for this crate and for every project that depends on it.
//!
//! By default: the system's libzmq, found by pkg-config (Debian/Ubuntu `libzmq3-dev`, macOS
//! `brew install zeromq`), which distributions build with libsodium, so CURVE works. With the
//! `vendored` feature: libzmq 4.3 compiled from source (C++, a minute or two) and linked statically
//! with the system's libsodium, so CURVE works there too. Nothing here depends on where the build
//! runs from: a `.cargo/config.toml` would apply only inside this crate's own directory.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "vendored")]
    vendored();
    #[cfg(not(feature = "vendored"))]
    system();
}

#[cfg(not(feature = "vendored"))]
fn system() {
    // 4.3: socket monitor events for handshakes, ZMQ_HEARTBEAT_*, zmq_has.
    if let Err(e) = pkg_config::Config::new().atleast_version("4.3").probe("libzmq") {
        panic!(
            "\n\ncronoq links the system's libzmq (4.3 or newer, built with libsodium for CURVE), and \
             pkg-config did not find it:\n{e}\n\nInstall it (Debian/Ubuntu: apt-get install libzmq3-dev \
             pkg-config; macOS: brew install zeromq pkg-config), or build libzmq from source with the \
             crate's `vendored` feature (it needs libsodium: libsodium-dev).\n\n"
        );
    }
}

#[cfg(feature = "vendored")]
fn vendored() {
    // CURVE needs libsodium: without it libzmq builds, but every encrypted socket then fails.
    let variable = |name: &str| {
        pkg_config::get_variable("libsodium", name).unwrap_or_else(|e| {
            panic!(
                "\n\nthe `vendored` feature of cronoq compiles libzmq with CURVE, which needs libsodium, and \
                 pkg-config did not find it:\n{e}\n\nInstall it (Debian/Ubuntu: apt-get install libsodium-dev \
                 pkg-config; macOS: brew install libsodium pkg-config).\n\n"
            )
        })
    };
    let (lib, include) = (variable("libdir"), variable("includedir"));
    // zeromq-src prints libsodium's directory in quotes (`{:?}`), which the linker cannot use:
    // say it plainly too.
    println!("cargo:rustc-link-search=native={lib}");
    zeromq_src::Build::new().with_libsodium(Some(zeromq_src::LibLocation::new(&lib, &include))).build();
}
