//! Courier on the Codex a user really has, not the layout `install/fetch-codex.sh` lays out:
//! Codex installed the usual way (`npm install -g`, which nests the native binary inside the
//! launcher package), then upgraded in place while the broker runs. Real npm (from its cache,
//! which fetch-codex.sh filled), real Codex, native digests checked against install/codex.sha256.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use courier_tests::broker::run_bounded;
use courier_tests::model::exec_held_per_session;
use courier_tests::util::marker;
use courier_tests::{broker_bin, Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// (version, sha256) lines of install/codex.sha256 for this platform, newest first.
fn pinned() -> Vec<(String, String)> {
    let sums = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../install/codex.sha256")).unwrap();
    sums.lines()
        .filter(|l| !l.starts_with('#') && l.contains("@openai/codex-linux-x64"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].to_string(), f[0].to_string())
        })
        .collect()
}

fn sha256(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `npm install -g --prefix PREFIX @openai/codex@VERSION` (offline-first from the user's npm
/// cache), then checks the nested native binary against the pinned digest. Returns it.
fn npm_install_global(prefix: &Path, version: &str) -> PathBuf {
    let out = run_bounded(
        Command::new("npm")
            .args(["install", "-g", "--prefix"])
            .arg(prefix)
            .args(["--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"])
            .arg(format!("@openai/codex@{version}")),
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "npm install -g @openai/codex@{version}: {out:?}");
    let native =
        prefix.join("lib/node_modules/@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex");
    assert!(native.is_file(), "npm -g nests the platform package: {} missing", native.display());
    assert!(!prefix.join("lib/node_modules/@openai/codex-linux-x64").exists(), "not hoisted");
    let want = pinned().into_iter().find(|(v, _)| v == version).expect("a pinned version").1;
    assert_eq!(sha256(&native), want, "npm installed a Codex {version} other than the pinned one");
    native
}

/// A home whose `codex` is the npm-global launcher (`PREFIX/bin/codex -> ../lib/.../codex.js`),
/// with Courier installed by `broker install` alone (profile start, the installed broker runs).
struct UserSetup {
    env: CodexEnv,
    npm_prefix: PathBuf,
    /// The directory on PATH that holds the user's `codex`.
    bin_dir: PathBuf,
    prefix: PathBuf,
}

impl UserSetup {
    fn new(model: &ScriptedModel, version: &str) -> UserSetup {
        let env = CodexEnv::new(model);
        let npm_prefix = env.root.join("npm-global");
        npm_install_global(&npm_prefix, version);
        UserSetup::with_codex(env, npm_prefix.join("bin/codex"))
    }

    /// A setup whose `codex` on PATH is `command` (installed by whatever package manager).
    fn with_codex(mut env: CodexEnv, command: PathBuf) -> UserSetup {
        env.codex = command.clone();
        let bin_dir = command.parent().unwrap().to_path_buf();
        let (npm_prefix, prefix) = (env.root.join("npm-global"), env.root.join("prefix"));
        UserSetup { env, npm_prefix, bin_dir, prefix }
    }

    fn path_var(&self) -> String {
        format!("{}:{}", self.bin_dir.display(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
    }

    fn run(&self, program: &Path, args: &[&str]) -> std::process::Output {
        let mut c = self.env.command(program);
        c.args(args).env("PATH", self.path_var());
        run_bounded(&mut c, Duration::from_secs(120))
    }

    fn install(&self) -> String {
        let (prefix, home) = (self.prefix.display().to_string(), self.env.codex_home.display().to_string());
        let out = self.run(&broker_bin(), &["install", "--prefix", &prefix, "--codex-home", &home, "--start", "profile"]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "broker install failed:\n{text}");
        text
    }

    fn cli(&self) -> Broker<'_> {
        let mut b = Broker::cli_only(&self.env);
        b.bin = self.prefix.join("broker");
        b
    }

    fn doctor(&self) -> String {
        let out = self.run(&self.prefix.join("broker"), &["doctor"]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// One real `codex exec` through the user's `codex`: a message sent while the model holds
    /// its first reply reaches the next request once and is confirmed. Returns the thread.
    fn deliver_one(&self, model: &ScriptedModel, hold: &Hold, label: &str) -> String {
        let cli = self.cli();
        let mut c = self.env.codex_command();
        c.env("PATH", self.path_var()).args(["exec", "--skip-git-repo-check", "please run a command"]);
        let child = courier_tests::codex::ExecChild::spawn(c);
        let before = model.requests().len();
        let first = model.wait_for_requests(before + 1, T).remove(before);
        hold.wait_held(1, T);
        let thread = first.thread_id().expect("thread id");
        let text = marker(label);
        let id = cli.send_opts(&thread, &text, None, Some("layouts"));
        hold.release();
        child.wait(T).assert_success();
        let reqs = model.requests_for_thread(&thread);
        let counts: Vec<usize> = reqs.iter().map(|r| r.items_containing(&text)).collect();
        assert_eq!(counts.iter().sum::<usize>(), 1, "delivered exactly once: {counts:?}\n{}", model.dump());
        cli.wait_state(&id, "confirmed", Duration::from_secs(15));
        thread
    }

    fn refusals(&self, reason: &str) -> Vec<Value> {
        courier_tests::broker::refusals(&self.cli().inspect_json()).into_iter().filter(|r| r["reason"] == reason).collect()
    }
}

impl Drop for UserSetup {
    fn drop(&mut self) {
        // The broker install started from the profile outlives it: stop it.
        let v = self.cli().inspect_json();
        if let Some(pid) = v.pointer("/broker/pid").and_then(Value::as_u64) {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

/// `npm install -g @openai/codex` then `broker install` alone: install trusts the nested native
/// binary behind the launcher and follows the command, doctor is green on Codex, and a real
/// session through the user's own `codex` gets its message, confirmed, with nothing refused.
#[test]
fn npm_global_codex_delivers_after_install_alone() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_per_session("echo hello", std::slice::from_ref(&hold)));
    let newest = pinned()[0].0.clone();
    let user = UserSetup::new(&model, &newest);
    let native = user
        .npm_prefix
        .join("lib/node_modules/@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex");
    let out = user.install();
    assert!(out.contains(&format!("trusted Codex binary {}", native.display())), "{out}");
    assert!(out.contains(&format!("following {}", user.npm_prefix.join("bin/codex").display())), "{out}");
    let doctor = user.doctor();
    assert!(doctor.contains(&format!("Codex binary {}, run by", native.display())), "{doctor}");
    assert!(doctor.contains("is trusted") && doctor.contains("in the tested range"), "{doctor}");
    assert!(!doctor.lines().any(|l| l.contains("FAIL") && l.to_lowercase().contains("codex")), "{doctor}");
    user.deliver_one(&model, &hold, "NPM_GLOBAL");
    for reason in ["untrusted_codex", "digest_pending", "no_codex_ancestor"] {
        assert!(user.refusals(reason).is_empty(), "{reason}: {:#}", user.cli().inspect_json());
    }
}

/// Codex upgraded in place (`npm install -g` of the newest over the oldest supported release)
/// while the broker runs: the first session after the upgrade delivers, confirmed, with no
/// command run in between; the broker lists the new binary as `followed`, with its version.
#[test]
fn codex_upgrade_in_place_keeps_delivering_with_nothing_to_do() {
    let (before, after) = (Hold::new(), Hold::new());
    let model = ScriptedModel::start_with(exec_held_per_session("echo hello", &[before.clone(), after.clone()]));
    let versions = pinned();
    let (newest, oldest) = (versions[0].clone(), versions[versions.len() - 1].clone());
    assert_ne!(newest.0, oldest.0, "two supported versions are pinned");
    let user = UserSetup::new(&model, &oldest.0);
    user.install();
    let t1 = user.deliver_one(&model, &before, "BEFORE_UPGRADE");

    npm_install_global(&user.npm_prefix, &newest.0);
    let t2 = user.deliver_one(&model, &after, "AFTER_UPGRADE");
    assert_ne!(t1, t2);
    let path = user.env.rollout_path(&t2).expect("the new session's rollout");
    let meta = courier_tests::rollout::read_records(&path).into_iter().next().expect("session_meta");
    assert_eq!(meta.pointer("/payload/cli_version").and_then(Value::as_str), Some(newest.0.as_str()), "the new Codex ran: {meta}");

    let v = user.cli().inspect_json();
    let trusted = v["trusted_codex"].as_array().cloned().unwrap_or_default();
    let followed = trusted.iter().find(|t| t["sha256"] == newest.1.as_str()).unwrap_or_else(|| panic!("new binary not trusted: {v:#}"));
    assert_eq!(followed["how"], "followed", "{followed}");
    assert_eq!(followed["version"], newest.0.as_str(), "{followed}");
    assert_eq!(followed["source"], user.npm_prefix.join("bin/codex").display().to_string().as_str(), "{followed}");
    assert!(user.refusals("untrusted_codex").is_empty(), "{v:#}");
    let log = std::fs::read_to_string(user.env.state_dir.join("broker.log")).unwrap_or_default();
    assert!(
        log.contains(&format!("trusted Codex {} at", newest.0)) && log.contains("now runs it"),
        "the automatic trust is logged:\n{log}"
    );
}

/// pnpm, yarn (classic) and bun, from the npm registry, installed once into the cache that
/// fetch-codex.sh uses (pinned versions). Returns the directory holding their commands.
fn package_managers() -> PathBuf {
    let cache = std::env::var_os("COURIER_CODEX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/courier"));
    let dir = cache.join("package-managers");
    let bin = dir.join("bin");
    if !["pnpm", "yarn", "bun"].iter().all(|t| bin.join(t).exists()) {
        let out = run_bounded(
            Command::new("npm").args(["install", "-g", "--prefix"]).arg(&dir).args([
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "pnpm@9.15.9",
                "yarn@1.22.22",
                "bun@1.4.5",
            ]),
            Duration::from_secs(300),
        );
        assert!(out.status.success(), "npm install pnpm yarn bun: {out:?}");
    }
    bin
}

/// `pm` installs Codex globally inside `root`, the way its users do; returns the `codex` command.
fn install_with(pm: &str, tools: &Path, root: &Path, version: &str) -> PathBuf {
    let spec = format!("@openai/codex@{version}");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Command::new(tools.join(pm));
    c.env("PATH", &path);
    let command = match pm {
        "pnpm" => {
            let home = root.join("pnpm-home");
            c.env("PNPM_HOME", &home).env("PATH", format!("{}:{path}", home.display()));
            c.args(["add", "-g", &spec, "--store-dir"]).arg(root.join("pnpm-store"));
            home.join("codex")
        }
        "yarn" => {
            c.args(["global", "add", &spec, "--global-folder"]).arg(root.join("yarn-global")).arg("--prefix").arg(root.join("yarn"));
            root.join("yarn/bin/codex")
        }
        "bun" => {
            c.env("BUN_INSTALL", root.join("bun")).args(["add", "-g", &spec]);
            root.join("bun/bin/codex")
        }
        "standalone" => {
            // A native binary dropped on PATH (a release tarball, a copied build).
            let bin = root.join("standalone/bin/codex");
            std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
            std::fs::copy(courier_tests::codex::codex_bin(), &bin).unwrap();
            return bin;
        }
        other => panic!("no such package manager {other}"),
    };
    let out = run_bounded(&mut c, Duration::from_secs(300));
    assert!(out.status.success(), "{pm} global add {spec}: {out:?}");
    assert!(command.exists(), "{pm} made no {}", command.display());
    command
}

/// Codex installed globally by pnpm (a shell shim into its `.pnpm` store, where the platform
/// package is an alias), yarn and bun (bin symlinks to the launcher), or as a standalone native
/// binary on PATH: `broker install` alone trusts the pinned native binary behind each, and a real
/// session through that `codex` delivers, confirmed.
#[test]
fn pnpm_yarn_bun_and_standalone_codex_deliver_after_install_alone() {
    let tools = package_managers();
    let (newest, digest) = pinned()[0].clone();
    for pm in ["pnpm", "bun", "yarn", "standalone"] {
        let hold = Hold::new();
        let model = ScriptedModel::start_with(exec_held_per_session("echo hello", std::slice::from_ref(&hold)));
        let env = CodexEnv::new(&model);
        let command = install_with(pm, &tools, &env.root.clone(), &newest);
        let user = UserSetup::with_codex(env, command);
        let out = user.install();
        let native: PathBuf = out
            .lines()
            .find_map(|l| l.strip_prefix("trusted Codex binary ")?.split(" (sha256:").next().map(PathBuf::from))
            .unwrap_or_else(|| panic!("{pm}: install trusted no Codex binary:\n{out}"));
        assert_eq!(sha256(&native), digest, "{pm}: {} is not the pinned Codex {newest}", native.display());
        assert!(native.starts_with(&user.env.root), "{pm}: resolved outside the install: {}", native.display());
        user.deliver_one(&model, &hold, &format!("VIA_{}", pm.to_uppercase()));
        assert!(user.refusals("untrusted_codex").is_empty(), "{pm}: {:#}", user.cli().inspect_json());
    }
}

/// A `codex` on PATH whose native binary is missing (npm skipped the optional platform
/// package): `broker install` installs the rest but exits 1, naming the path and the fix; doctor
/// fails on it with the exact path.
#[test]
fn a_codex_that_cannot_be_resolved_makes_install_exit_1_with_the_fix() {
    let model = ScriptedModel::start_with(|_| Reply::message("done"));
    let env = CodexEnv::new(&model);
    let prefix = env.root.join("broken-npm");
    let launcher = prefix.join("lib/node_modules/@openai/codex/bin/codex.js");
    std::fs::create_dir_all(launcher.parent().unwrap()).unwrap();
    std::fs::write(&launcher, "#!/usr/bin/env node\n// launcher without its platform package\n").unwrap();
    std::fs::write(prefix.join("lib/node_modules/@openai/codex/package.json"), "{}").unwrap();
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::os::unix::fs::symlink("../lib/node_modules/@openai/codex/bin/codex.js", prefix.join("bin/codex")).unwrap();
    let user = UserSetup::with_codex(env, prefix.join("bin/codex"));
    let (p, home) = (user.prefix.display().to_string(), user.env.codex_home.display().to_string());
    let out = user.run(&broker_bin(), &["install", "--prefix", &p, "--codex-home", &home, "--start", "none"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.contains(&format!("the codex on PATH ({}) cannot be trusted", prefix.join("bin/codex").display())), "{stderr}");
    assert!(stderr.contains("platform package") && stderr.contains("fix:"), "{stderr}");
    assert!(user.prefix.join("hook-client").is_file(), "the rest of the installation stands");
    let doctor = user.doctor();
    assert!(doctor.lines().any(|l| l.contains("FAIL") && l.contains(&prefix.join("bin/codex").display().to_string())), "{doctor}");
}
