//! Following Claude Code's native-installer upgrade (`claude/follow.rs`), on real files in a
//! throwaway HOME: `~/.local/bin/claude` links to `~/.local/share/claude/versions/<version>`, a
//! copy of the pinned binary (`COURIER_CLAUDE_BIN`); `broker install` trusts it and records the
//! command; with `broker serve` running, the installer's switch of the link to a new version is
//! trusted as `followed`, and a file in `versions/` that the link does not point to is not;
//! uninstall forgets both digests (no claude runs there: the broker never executes a candidate).
//! Then the upgraded claude itself: its first hook, before the follower's pass, is trusted
//! through the gate's expected lane, and a stray version run directly is refused.

use courier_tests::claude::gate::{claude_refusals, proven_hooks, ClaudeBroker};
use courier_tests::claude::{claude_bin, env_or_skip, say_skipped};
use courier_tests::install_rig::Rig;
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::util::{poll_until, wait_until};
use courier_tests::{Broker, CodexEnv, Serve};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The pinned binary's bytes with `tag` appended: a whole ELF with a digest of its own.
fn version_file(path: &Path, pinned: &Path, tag: &str) -> String {
    let mut bytes = std::fs::read(pinned).unwrap();
    bytes.extend_from_slice(format!("\ncourier-claude-follow {tag}\n").as_bytes());
    std::fs::write(path, &bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    broker_lib::exe::sha256_file(path).unwrap()
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

/// The first hook after an upgrade (`claude/follow.rs`, the digest cache's expected lane): the
/// native installer has switched `~/.local/bin/claude` to `versions/2.1.333` and the follower has
/// not trusted it (failpoint `claude_follow_late`: its passes trust nothing, as when the hook
/// comes first). The upgraded claude's first hook waits for the new binary's hash, which is
/// trusted as `followed` because the followed command runs exactly that file: the
/// UserPromptSubmit is proven, and a message sent during the turn's Bash call reaches the model
/// once, `confirmed`. A stray version in `versions/` that the link does not point to, run
/// directly, is refused `untrusted_claude` at every hook and never trusted.
#[test]
fn an_upgraded_claudes_first_hook_passes_before_the_followers_pass_and_a_stray_version_is_refused() {
    let api = ScriptedMessages::start_with(|r| match r.tool_results().is_empty() {
        true => Turn::bash("sleep 4; echo slept"),
        false => Turn::text("done"),
    });
    let Some(mut env) = env_or_skip(&api) else { return };
    let pinned = env.claude.clone();
    let versions = env.home.join(".local/share/claude/versions");
    std::fs::create_dir_all(&versions).unwrap();
    std::fs::create_dir_all(env.home.join(".local/bin")).unwrap();
    let link = env.home.join(".local/bin/claude");
    version_file(&versions.join("2.1.332"), &pinned, "A");
    std::os::unix::fs::symlink(versions.join("2.1.332"), &link).unwrap();
    let b = version_file(&versions.join("2.1.333"), &pinned, "B");
    let stray = version_file(&versions.join("9.9.9"), &pinned, "stray");
    let cb = ClaudeBroker::new();
    let cli = Broker::cli_only(&cb.env);
    cli.trust_claude(&link);
    // The command, recorded as `broker install` records it.
    let mut store = broker_lib::store::Store::open(&cb.env.state_dir).unwrap();
    store.follow_claude_command(&link.display().to_string()).unwrap();
    drop(store);
    let serve = Serve::start(&cb.env, &[("COURIER_FAILPOINTS", "claude_follow_late")]);
    env.set_courier_hooks(cb.port);

    // The upgrade, then the person's next `claude`.
    switch_link(&link, &versions.join("2.1.333"));
    env.claude = link.clone();
    let child = env.spawn_print("run the command");
    let first = poll_until(Duration::from_secs(30), || proven_hooks(&serve.log_text()).first().cloned())
        .unwrap_or_else(|| panic!("no hook of the upgraded claude proven: {:?}\n{}", claude_refusals(&cli), serve.log_text()));
    assert_eq!(first.0, "UserPromptSubmit", "the first hook was proven: {first:?}");
    assert!(claude_refusals(&cli).is_empty(), "{:?}", claude_refusals(&cli));
    assert!(trusted(&cb.env.state_dir).contains(&(b.clone(), "followed".to_string())), "{:?}", trusted(&cb.env.state_dir));
    let log = serve.log_text();
    assert!(log.contains(&format!("trusted Claude Code 2.1.333 at {}", versions.join("2.1.333").display())), "no log line:\n{log}");

    let text = courier_tests::util::marker("CLAUDE_UPGRADED");
    let id = cli.send(&first.1, &text, None);
    let m = cli.wait_state(&id, "confirmed", Duration::from_secs(60));
    assert_eq!(m["attempts"], 1, "offered once: {m}");
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let carrying: Vec<usize> = api.requests().iter().filter(|r| r.body_contains(&text)).map(|r| r.index).collect();
    assert_eq!(carrying.len(), 1, "one request carried it: {carrying:?}\n{}", api.dump());
    assert!(claude_refusals(&cli).is_empty(), "{:?}", claude_refusals(&cli));

    // A stray version, run directly: no followed command runs it.
    let served = proven_hooks(&serve.log_text()).len();
    env.claude = versions.join("9.9.9");
    let out = env.print("run the command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let refused = poll_until(Duration::from_secs(10), || Some(claude_refusals(&cli)).filter(|r| r.len() >= 4)).unwrap_or_default();
    assert_eq!(refused.len(), 4, "{refused:?}\n{}", serve.log_text());
    assert!(refused.iter().all(|(code, _)| code == "untrusted_claude"), "{refused:?}");
    assert_eq!(proven_hooks(&serve.log_text()).len(), served, "{}", serve.log_text());
    let all = trusted(&cb.env.state_dir);
    assert!(!all.iter().any(|(d, _)| d == &stray), "a version the link does not point to was trusted: {all:?}");
}
