//! Release builds of hook-client on glibc Linux are linked statically (static-pie): no dynamic
//! loader, libc.so or libgcc_s.so to map at each start, which makes every hook call cheaper
//! (bench/README.md). `cargo build --release` does it by itself:
//!
//! - `-C target-feature=+crt-static` cannot be set for one package on stable cargo (in
//!   `.cargo/config.toml` it would also reach proc-macros, which cannot be static);
//! - rustc always asks for std's libraries as `-Bdynamic -lgcc_s -lc ...`, so this script puts
//!   a directory first on the search path whose `libgcc_s.a`, `libc.a`, ... are the static
//!   archives (libgcc_s's static counterpart is libgcc_eh). The linker takes the first match in
//!   search order, so nothing dynamic is linked, and `-static-pie` gives the self-relocating
//!   start-up (rcrt1.o) with no interpreter.
//!
//! If a static archive is missing (no libc6-dev static libs), the build stays dynamic and says so.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries rustc passes for std on linux-gnu, each with the static archive that stands in.
const STATIC_FOR: [(&str, &str); 7] = [
    ("gcc_s", "libgcc_eh.a"),
    ("c", "libc.a"),
    ("m", "libm.a"),
    ("dl", "libdl.a"),
    ("pthread", "libpthread.a"),
    ("rt", "librt.a"),
    ("util", "libutil.a"),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=COURIER_DYNAMIC_HOOK_CLIENT");
    let target = std::env::var("TARGET").unwrap_or_default();
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    if !release || !target.ends_with("-linux-gnu") || std::env::var_os("COURIER_DYNAMIC_HOOK_CLIENT").is_some() {
        return;
    }
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("static-libs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/static-libs");
    for (name, archive) in STATIC_FOR {
        let Some(path) = archive_path(archive) else {
            println!("cargo:warning=hook-client: no {archive} (install libc6-dev); linking dynamically, hook calls will be slower");
            return;
        };
        std::os::unix::fs::symlink(&path, dir.join(format!("lib{name}.a"))).expect("symlink static archive");
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-arg-bins=-static-pie");
}

/// Where the C compiler finds `archive` (`cc -print-file-name` echoes the bare name when it has none).
fn archive_path(archive: &str) -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(cc).arg(format!("-print-file-name={archive}")).output().ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (path.is_absolute() && Path::new(&path).is_file()).then(|| path.canonicalize().unwrap_or(path))
}
