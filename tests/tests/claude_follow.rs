//! Following Claude Code's native-installer upgrade (`claude/follow.rs`), on real files in a
//! throwaway HOME: `~/.local/bin/claude` links to `~/.local/share/claude/versions/<version>`, a
//! copy of the pinned binary (`COURIER_CLAUDE_BIN`); `broker install` trusts it and records the
//! command; with `broker serve` running, the installer's switch of the link to a new version is
//! trusted as `followed`, and a file in `versions/` that the link does not point to is not;
//! uninstall forgets both digests. No
//! claude runs (the broker never executes a candidate, and neither does this test).

use courier_tests::claude::{claude_bin, say_skipped};
use courier_tests::install_rig::Rig;
use courier_tests::util::wait_until;
use courier_tests::{CodexEnv, Serve};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The pinned binary's bytes with `tag` appended: a whole ELF with a digest of its own.
fn version_file(path: &Path, pinned: &Path, tag: &str) -> String {
    let mut bytes = std::fs::read(pinned).unwrap();
    bytes.extend_from_slice(format!("\ncourier-claude-follow {tag}\n").as_bytes());
    std::fs::write(path, &bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    broker_lib::codex::sha256_file(path).unwrap()
}

/// (digest, how) of every trusted Claude Code binary in the rig's store.
fn trusted(state_dir: &Path) -> Vec<(String, String)> {
    let store = broker_lib::store::Store::open(state_dir).unwrap();
    store.trusted_claude().unwrap().into_iter().map(|t| (t.sha256, t.how.as_str().to_string())).collect()
}

/// Points `link` at `target` the way an installer does: a new link renamed over the old one.
fn switch_link(link: &Path, target: &Path) {
    let next = link.with_file_name(".claude.new");
    std::os::unix::fs::symlink(target, &next).unwrap();
    std::fs::rename(&next, link).unwrap();
}

#[test]
fn the_native_installers_upgrade_is_followed_and_a_stray_version_is_not() {
    let Some(pinned) = claude_bin() else { return say_skipped() };
    let rig = Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"));
    let home = rig.env.home.clone();
    let versions = home.join(".local/share/claude/versions");
    std::fs::create_dir_all(&versions).unwrap();
    std::fs::create_dir_all(home.join(".local/bin")).unwrap();
    let link: PathBuf = home.join(".local/bin/claude");
    let a = version_file(&versions.join("2.1.332"), &pinned, "A");
    std::os::unix::fs::symlink(versions.join("2.1.332"), &link).unwrap();
    let out = rig.install(&["--start", "none"]);
    assert!(out.contains("trusted Claude Code binary"), "install did not trust the native installer's claude:\n{out}");
    assert_eq!(trusted(&rig.env.state_dir), vec![(a.clone(), "install".to_string())]);

    let serve = Serve::start(&rig.env, &[]);
    // A stray file in versions/ (what a tool command could plant), then the real upgrade.
    let stray = version_file(&versions.join("9.9.9"), &pinned, "stray");
    let b = version_file(&versions.join("2.1.333"), &pinned, "B");
    switch_link(&link, &versions.join("2.1.333"));
    wait_until(Duration::from_secs(20), "the broker to follow the upgrade to versions/2.1.333", || {
        trusted(&rig.env.state_dir).contains(&(b.clone(), "followed".to_string())).then_some(())
    });
    let all = trusted(&rig.env.state_dir);
    assert!(!all.iter().any(|(d, _)| d == &stray), "a version the link does not point to was trusted: {all:?}");
    let log = serve.log_text();
    assert!(log.contains(&format!("trusted Claude Code 2.1.333 at {}", versions.join("2.1.333").display())), "no log line:\n{log}");
    assert!(log.contains(&b[..12]), "the log line names no digest:\n{log}");

    // Uninstall forgets what install trusted and what the follower trusted of its commands.
    drop(serve);
    let out = rig.run_ok(&courier_tests::broker_bin(), &["uninstall"]);
    assert_eq!(trusted(&rig.env.state_dir), vec![], "uninstall left digests trusted:\n{out}");
}
