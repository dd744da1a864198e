//! Courier installed the way Codex is: the two packages install/package.sh makes (a launcher and
//! the linux-x64 platform package) published to a real local npm registry (verdaccio, pinned and
//! fetched by install/fetch-verdaccio.sh, offline), then the README's `npm install -g
//! @courier-codex/courier` into a fresh npm prefix, on a PATH with no cargo or rustc; then `broker
//! install`, a real `codex exec`, and an in-place upgrade of the package. From tarballs too: the
//! launcher alone (its advice) and the README's one-line command for both. The packages hold this
//! checkout's debug binaries (what the test run already built; a release build would add minutes
//! on 2 cores): the packing, the npm layout and the install path are the ones a release goes
//! through.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use codex_format::hook::HookEvent;
use courier_tests::broker::{run_bounded, target_bin_dir};
use courier_tests::codex::ExecChild;
use courier_tests::model::exec_held_per_session;
use courier_tests::util::marker;
use courier_tests::{CodexEnv, Hold, ScriptedModel};
use serde_json::Value;

use courier_tests::install_rig::{statuses, text, Rig};

const T: Duration = Duration::from_secs(60);
const PLATFORM: &str = "@courier-codex/courier-linux-x64";
/// What the test packs: the bridge is left out (its debug build alone is over 100 MB).
const BINS: [&str; 3] = ["broker", "hook-client", "courier-mcp"];

/// npm's registry until a test starts its own: a port nothing listens on (npm runs offline).
const NO_REGISTRY: &str = "http://127.0.0.1:9/";

/// A real npm registry on 127.0.0.1 (verdaccio, no uplinks: nothing comes from the internet),
/// with one user allowed to publish `@courier-codex/*`. Killed on drop.
struct Registry {
    child: std::process::Child,
    url: String,
    /// An npm user config holding the publisher's token.
    npmrc: PathBuf,
}

impl Registry {
    fn start(dir: &Path) -> Registry {
        let verdaccio = std::env::var_os("COURIER_VERDACCIO_BIN").map(PathBuf::from).unwrap_or_else(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../install/fetch-verdaccio.sh");
            let out = run_bounded(&mut Command::new(&script), Duration::from_secs(300));
            assert!(out.status.success(), "{}: {}", script.display(), text(&out.stderr));
            PathBuf::from(text(&out.stdout).lines().last().unwrap_or_default().trim())
        });
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            "storage: ./storage\nauth:\n  htpasswd:\n    file: ./htpasswd\nuplinks: {}\npackages:\n  '@courier-codex/*':\n    \
             access: $all\n    publish: $authenticated\n  '**':\n    access: $all\nlog: { type: stdout, format: pretty, level: warn }\n",
        )
        .unwrap();
        // A port free now; verdaccio binds it at once (nothing else of the test takes ports here).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.join("verdaccio.log")).unwrap();
        let child = Command::new(&verdaccio)
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", verdaccio.display()));
        let url = format!("http://127.0.0.1:{port}/");
        let registry = Registry { child, url, npmrc: dir.join("npmrc") };
        courier_tests::util::wait_until(T, "verdaccio to answer", || registry.http("GET", "/-/ping", "").ok());
        let user = registry.http("PUT", "/-/user/org.couchdb.user:courier", r#"{"name":"courier","password":"courier-test"}"#).unwrap();
        let token: Value = serde_json::from_str(user.split("\r\n\r\n").nth(1).unwrap_or_default()).unwrap_or_default();
        let token = token["token"].as_str().unwrap_or_else(|| panic!("no token: {user}")).to_string();
        std::fs::write(&registry.npmrc, format!("//127.0.0.1:{port}/:_authToken={token}\n")).unwrap();
        registry
    }

    /// One HTTP/1.1 request; the whole answer when its status is 2xx.
    fn http(&self, method: &str, path: &str, body: &str) -> Result<String, String> {
        let addr = self.url.trim_start_matches("http://").trim_end_matches('/');
        let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
        if answer.starts_with("HTTP/1.1 2") {
            Ok(answer)
        } else {
            Err(answer)
        }
    }

    /// `npm publish` of a packed tarball, as the release workflow runs it (platform package first).
    fn publish(&self, user: &NpmUser, tarball: &Path) {
        let mut c = user.command("npm", false);
        c.args(["publish", "--access", "public", "--loglevel=error"]).arg(tarball).env("npm_config_userconfig", &self.npmrc);
        let out = run_bounded(&mut c, Duration::from_secs(120));
        assert!(out.status.success(), "npm publish {}: {}\n{}", tarball.display(), text(&out.stdout), text(&out.stderr));
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A user with node and npm but no Rust: a fresh npm prefix, a home, the pinned `codex` on PATH;
/// npm's registry is the test's own (`registry`), or none that answers.
struct NpmUser {
    rig: Rig,
    npm_prefix: PathBuf,
    npm_cache: PathBuf,
    registry: String,
}

impl NpmUser {
    fn new(model: &ScriptedModel) -> NpmUser {
        let rig = Rig::new(CodexEnv::new(model));
        let (npm_prefix, npm_cache) = (rig.env.root.join("npm-global"), rig.env.root.join("npm-cache"));
        // Until a test starts its registry: a port nothing listens on, so nothing is fetched.
        NpmUser { rig, npm_prefix, npm_cache, registry: NO_REGISTRY.into() }
    }

    fn env(&self) -> &CodexEnv {
        &self.rig.env
    }

    /// Where `broker install` puts the binaries by default.
    fn local_bin(&self) -> PathBuf {
        self.env().home.join(".local/bin")
    }

    /// The npm bin directory and the `codex` first, then the system's: no cargo, no rustc.
    /// `installed_first`: `~/.local/bin` ahead of everything, as Debian's ~/.profile puts it.
    fn path_var(&self, installed_first: bool) -> String {
        let mut dirs = vec![self.npm_prefix.join("bin"), self.rig.path_dir.clone(), "/usr/bin".into(), "/bin".into()];
        if installed_first {
            dirs.insert(0, self.local_bin());
        }
        for d in &dirs {
            for tool in ["cargo", "rustc", "rustup"] {
                assert!(!d.join(tool).exists(), "{} is on the test's PATH", d.join(tool).display());
            }
        }
        std::env::join_paths(dirs).unwrap().into_string().unwrap()
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>, installed_first: bool) -> Command {
        let mut c = self.env().command(program);
        // npm's own settings by environment, so a command reads as the docs write it.
        c.env("PATH", self.path_var(installed_first))
            .env("npm_config_cache", &self.npm_cache)
            .env("npm_config_prefix", &self.npm_prefix)
            .env("npm_config_registry", &self.registry)
            .env("npm_config_audit", "false")
            .env("npm_config_fund", "false")
            .env("npm_config_update_notifier", "false")
            .env("npm_config_fetch_retries", "0");
        if self.registry == NO_REGISTRY {
            // Nothing to ask: without this npm waits on the dead registry for a minute.
            c.env("npm_config_offline", "true");
        }
        c
    }

    /// `broker ARGS`, found on PATH the way the user's shell finds it.
    fn broker(&self, args: &[&str], installed_first: bool) -> Output {
        let mut c = self.command("broker", installed_first);
        c.args(args);
        run_bounded(&mut c, Duration::from_secs(120))
    }

    fn broker_ok(&self, args: &[&str], installed_first: bool) -> String {
        let out = self.broker(args, installed_first);
        assert!(out.status.success(), "broker {args:?}: {}\n{}\n{}", out.status, text(&out.stdout), text(&out.stderr));
        format!("{}{}", text(&out.stdout), text(&out.stderr))
    }

    /// `install/package.sh --bin-dir` of `bins` as `version`, on the Rust-less PATH. Returns the
    /// npm tarballs, the platform package first.
    fn pack(&self, bins: &Path, version: &str) -> Vec<PathBuf> {
        let out_dir = self.env().root.join(format!("package-{version}"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../install/package.sh");
        let mut c = self.command(&script, false);
        c.arg("--bin-dir").arg(bins).arg("--version").arg(version).arg("--out").arg(&out_dir);
        let out = run_bounded(&mut c, Duration::from_secs(300));
        assert!(out.status.success(), "package.sh: {}\n{}", text(&out.stdout), text(&out.stderr));
        let dist = out_dir.join(format!("courier-{version}-x86_64-unknown-linux-gnu"));
        let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
        assert_eq!(sums.lines().count(), BINS.len(), "{sums}");
        let tarball = out_dir.join(format!("courier-{version}-x86_64-unknown-linux-gnu.tar.gz"));
        assert!(tarball.is_file(), "{} missing", tarball.display());
        ["courier-codex-courier-linux-x64", "courier-codex-courier"]
            .map(|p| out_dir.join("npm").join(format!("{p}-{version}.tgz")))
            .into_iter()
            .inspect(|t| assert!(t.is_file(), "{} missing: {}", t.display(), text(&out.stdout)))
            .collect()
    }

    /// The npm tarballs `install/package.sh` already made in `dir` (its `--out`), the platform
    /// package first: `COURIER_PACKAGE_DIR` runs this test on a release's own packages.
    fn packed(&self, dir: &Path) -> Vec<PathBuf> {
        let version = env!("CARGO_PKG_VERSION");
        ["courier-codex-courier-linux-x64", "courier-codex-courier"]
            .map(|p| dir.join("npm").join(format!("{p}-{version}.tgz")))
            .into_iter()
            .inspect(|t| assert!(t.is_file(), "{} missing (COURIER_PACKAGE_DIR)", t.display()))
            .collect()
    }

    /// `npm install -g` of local tarballs into the prefix, offline (nothing comes from a registry).
    fn npm_install(&self, tarballs: &[PathBuf]) {
        let mut c = self.command("npm", false);
        c.args(["install", "-g", "--offline", "--loglevel=error"]).args(tarballs);
        let out = run_bounded(&mut c, Duration::from_secs(300));
        assert!(out.status.success(), "npm install -g: {}\n{}", text(&out.stdout), text(&out.stderr));
    }

    /// A shell command line as a person types it (from the docs, or an error's advice), in `dir`.
    fn shell(&self, line: &str, dir: &Path) -> Output {
        let mut c = self.command("sh", false);
        c.arg("-c").arg(line).current_dir(dir);
        run_bounded(&mut c, Duration::from_secs(300))
    }

    fn shell_ok(&self, line: &str, dir: &Path) {
        let out = self.shell(line, dir);
        assert!(out.status.success(), "`{line}`: {}\n{}", text(&out.stdout), text(&out.stderr));
    }

    /// The platform package's native binaries, as npm laid them out: from a registry, inside the
    /// launcher's own node_modules (a dependency of it); from tarballs given together, beside it.
    fn vendor_dir(&self) -> PathBuf {
        let modules = self.npm_prefix.join("lib/node_modules");
        let nested = modules.join("@courier-codex/courier/node_modules").join(PLATFORM);
        let package = if nested.is_dir() { nested } else { modules.join(PLATFORM) };
        package.join("vendor/x86_64-unknown-linux-gnu/bin")
    }

    /// A real `codex exec`: a `broker send --wait confirmed` (the `broker` on PATH) issued while
    /// the model holds its first reply exits 0 once the model has the message; it reached the
    /// model exactly once. Returns when the send returned.
    fn deliver_one(&self, model: &ScriptedModel, hold: &Hold, label: &str, installed_first: bool) -> Instant {
        let mut c = self.command(&self.env().codex, installed_first);
        c.args(["exec", "--skip-git-repo-check", "please run a command"]);
        let child = ExecChild::spawn(c);
        let before = model.requests().len();
        let first = model.wait_for_requests(before + 1, T).remove(before);
        hold.wait_held(1, T);
        let thread = first.thread_id().expect("thread id");
        let msg = marker(label);
        let mut send = self.command("broker", installed_first);
        send.args(["send", "--thread", &thread, "--from", "package-test", "--wait", "confirmed", "--timeout", "60s", &msg]);
        let mut send = send.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // The id comes first, once the message is queued: release the held reply only then, so
        // it rides the next hook of this turn.
        let mut id = String::new();
        BufReader::new(send.stdout.as_mut().unwrap()).read_line(&mut id).unwrap();
        assert!(id.trim().starts_with("m_"), "send printed {id:?} first");
        hold.release();
        let out = send.wait_with_output().unwrap();
        let sent = Instant::now();
        child.wait(T).assert_success();
        assert!(out.status.success(), "send --wait confirmed: {}\n{}\n{}", out.status, text(&out.stdout), text(&out.stderr));
        let state = &self.inspect(installed_first)["messages"];
        let entry = state.as_array().and_then(|a| a.iter().find(|m| m["id"] == id.trim())).cloned().unwrap_or_default();
        assert_eq!(entry["state"], "confirmed", "{state:#}");
        let counts: Vec<usize> = model.requests_for_thread(&thread).iter().map(|r| r.items_containing(&msg)).collect();
        assert_eq!(counts.iter().sum::<usize>(), 1, "delivered exactly once: {counts:?}\n{}", model.dump());
        sent
    }

    fn inspect(&self, installed_first: bool) -> Value {
        serde_json::from_str(self.broker_ok(&["inspect", "--json"], installed_first).trim()).unwrap_or(Value::Null)
    }
}

/// The commands of the README's install block (its first ```sh block after `## Install`), without
/// their comments: what a person copies.
fn readme_install_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let section = &readme[readme.find("\n## Install\n").expect("README has ## Install")..];
    let block = &section[section.find("```sh\n").expect("an sh block under ## Install") + 6..];
    let block = &block[..block.find("```").unwrap()];
    block.lines().map(|l| l.split(" #").next().unwrap().trim().to_string()).filter(|l| !l.is_empty()).collect()
}

/// The README's one command installing both packages from the tarballs install/package.sh makes.
fn readme_npm_line() -> String {
    let commands = readme_install_commands();
    commands.iter().find(|c| c.starts_with("npm install -g")).cloned().unwrap_or_else(|| panic!("no npm install in {commands:?}"))
}

/// This checkout's binaries copied to `dir` without their debug info (as the release profile
/// builds them; packing the debug info took minutes); with `trailer`, each gets bytes appended
/// (an ELF runs unchanged with them), so an "upgrade" really changes every file.
fn stage_bins(dir: &Path, trailer: Option<&[u8]>) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for b in BINS {
        let stripped = dir.join(b);
        let out = run_bounded(Command::new("objcopy").arg("--strip-debug").arg(target_bin_dir().join(b)).arg(&stripped), T);
        assert!(out.status.success(), "objcopy --strip-debug {b}: {}", text(&out.stderr));
        let mut bytes = std::fs::read(&stripped).unwrap();
        if let Some(t) = trailer {
            bytes.extend_from_slice(t);
        }
        std::fs::write(dir.join(b), bytes).unwrap();
        courier_tests::codex::set_mode(&dir.join(b), 0o755);
    }
    dir.to_path_buf()
}

fn size_mb(p: &Path) -> f64 {
    std::fs::metadata(p).unwrap().len() as f64 / 1e6
}

fn pid_exe(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default()
}

/// The packed packages published to a local registry, then the README's `npm install -g
/// @courier-codex/courier` into a fresh prefix (no cargo or rustc on PATH) and `broker install`:
/// the hook-client Codex trusts and the broker started at login are native copies in
/// ~/.local/bin, not node_modules; a real `codex exec` gets a `send --wait confirmed` message
/// once, confirmed. Then a new version is published and installed in place with docs/install.md's
/// upgrade command (every binary's bytes change): the installed copy (first on a login PATH)
/// installs only itself and names the package's broker; the launcher names itself; its `broker
/// install` takes the new binaries, every hook stays trusted with hooks.json and config.toml
/// untouched, and the next session delivers again.
#[test]
fn npm_package_installs_delivers_and_upgrades_in_place() {
    let (hold, hold_after) = (Hold::new(), Hold::new());
    let model = ScriptedModel::start_with(exec_held_per_session("echo hello", &[hold.clone(), hold_after.clone()]));
    let mut user = NpmUser::new(&model);
    let root = user.env().root.clone();
    // A release's packages when given (COURIER_BIN_DIR then names its binaries, for the upgrade).
    let release = std::env::var_os("COURIER_PACKAGE_DIR").map(PathBuf::from);
    let v1 = match &release {
        Some(dir) => user.packed(dir),
        None => user.pack(&stage_bins(&root.join("bins-v1"), None), env!("CARGO_PKG_VERSION")),
    };
    let v2 = user.pack(&stage_bins(&root.join("bins-v2"), Some(b"\0courier upgrade\n")), "0.1.1");
    let registry = Registry::start(&root.join("registry"));
    user.registry = registry.url.clone();
    let start = Instant::now();
    for tarball in &v1 {
        registry.publish(&user, tarball);
    }
    let published = start.elapsed();

    // Install from nothing, as the README says once published: npm, then `broker install`
    // through the launcher npm put on PATH.
    let readme = readme_install_commands();
    let from_registry = "npm install -g @courier-codex/courier";
    let readme_text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    assert!(readme_text.contains(&format!("`{from_registry}`")), "the README names the registry command");
    user.shell_ok(from_registry, &user.env().work);
    let launcher = user.npm_prefix.join("bin/broker");
    assert!(std::fs::read_to_string(&launcher).unwrap().starts_with("#!/usr/bin/env node"), "npm links the node launcher");
    assert!(readme.contains(&"broker install".to_string()), "{readme:?}");
    let out = user.broker_ok(&["install", "--start", "profile"], false);
    let client = user.local_bin().join("hook-client");
    assert!(out.contains(&format!("installed {}", client.display())), "{out}");
    // ~/.local/bin is not on this PATH, yet `broker` is found: the note says which one runs.
    assert!(out.contains(&format!("note: `broker` on your PATH is {}", launcher.display())) && !out.contains("will not be found"), "{out}");
    let manifest: Value = serde_json::from_slice(&std::fs::read(user.env().state_dir.join("install-manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["package"].as_str().map(PathBuf::from), Some(user.vendor_dir()), "{manifest:#}");
    let command = broker_lib::install::hook_command(&client);
    let trusted = |env: &CodexEnv| statuses(env).into_values().filter(|(c, s)| *c == command && s == "trusted").count();
    assert_eq!(trusted(user.env()), HookEvent::REGISTERED.len(), "{:#?}", statuses(user.env()));
    let pid = user.rig.wait_running();
    assert_eq!(pid_exe(pid), user.local_bin().join("broker"), "the broker started is the installed native copy");
    let first = user.deliver_one(&model, &hold, "NPM_FIRST", false);
    let to_first_delivery = first - start;

    // A new version, published and installed in place with docs/install.md's upgrade command.
    let files = [user.env().hooks_json_path(), user.env().config_toml_path()];
    let before = user.rig.snapshot(&files);
    for tarball in &v2 {
        registry.publish(&user, tarball);
    }
    let install_md = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/install.md")).unwrap();
    let upgrade = "npm install -g @courier-codex/courier@latest";
    assert!(install_md.contains(&format!("`{upgrade}`")), "docs/install.md names the upgrade command");
    user.shell_ok(upgrade, &user.env().work);
    let upgraded = |b: &str| std::fs::read(user.local_bin().join(b)).unwrap().ends_with(b"courier upgrade\n");
    // The installed copy, first on a login PATH, installs only itself and says what to run.
    let out = user.broker_ok(&["install", "--start", "profile"], true);
    assert!(BINS.iter().all(|b| !upgraded(b)), "the installed copy copied from the package:\n{out}");
    let package_broker = user.vendor_dir().join("broker");
    assert!(out.contains(&format!("`{} install`", package_broker.display())), "{out}");
    // The launcher notices the installed copies are not the package's, and names itself.
    let hint = user.broker(&["--version"], false);
    let advice = format!("run `{} install`", launcher.display());
    assert!(text(&hint.stderr).contains(&advice), "{}", text(&hint.stderr));
    let mut c = user.command(&launcher, true);
    c.args(["install", "--start", "profile"]);
    let out = run_bounded(&mut c, Duration::from_secs(120));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success() && said.contains(&format!("installed {}", client.display())), "{said}");
    for b in BINS {
        let (ours, packaged) = (std::fs::read(user.local_bin().join(b)).unwrap(), std::fs::read(user.vendor_dir().join(b)).unwrap());
        assert!(ours == packaged && upgraded(b), "{b} is not the upgraded package's");
    }
    assert_eq!(user.rig.snapshot(&files), before, "the upgrade changed hooks.json or config.toml:\n{said}");
    assert_eq!(trusted(user.env()), HookEvent::REGISTERED.len(), "{:#?}", statuses(user.env()));
    let hint = user.broker(&["--version"], false);
    assert!(!text(&hint.stderr).contains("broker install"), "{}", text(&hint.stderr));
    let pid = user.rig.wait_running();
    assert_eq!(pid_exe(pid), user.local_bin().join("broker"));
    user.deliver_one(&model, &hold_after, "NPM_UPGRADED", true);

    let [platform, launcher_tgz] = [&v1[0], &v1[1]];
    println!(
        "package sizes ({} binaries): platform {:.1} MB, launcher {:.3} MB; both published in {:.1} s; \
         npm install to first delivery {:.1} s",
        if release.is_some() { "release" } else { "debug" },
        size_mb(platform),
        size_mb(launcher_tgz),
        published.as_secs_f64(),
        (to_first_delivery - published).as_secs_f64()
    );
}

/// From tarballs, without a registry: the launcher tarball alone installs but cannot run, and its
/// error names a command that exists and works (both tarballs, by path, in one `npm install -g`);
/// the README's one-line command does the same from where install/package.sh put them. Then a
/// package whose binary does not match its SHA256SUMS (an upgrade half done, a damaged download)
/// is refused whole: nothing of it is installed and the error says what to run.
#[test]
fn tarballs_install_as_the_docs_say_and_a_damaged_package_is_not_installed() {
    let model = ScriptedModel::start_with(|_| courier_tests::Reply::message("done"));
    let user = NpmUser::new(&model);
    let root = user.env().root.clone();
    let tarballs = user.pack(&stage_bins(&root.join("bins"), None), "0.1.0");
    let [platform, launcher] = [&tarballs[0], &tarballs[1]];

    // The launcher alone: npm says nothing, `broker` says what to run.
    user.npm_install(std::slice::from_ref(launcher));
    let out = user.broker(&["--version"], false);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let advice = err.split("in one command: ").nth(1).unwrap_or_else(|| panic!("no command in: {err}")).trim().to_string();
    assert_eq!(advice, format!("npm install -g {} {}", platform.display(), launcher.display()), "{err}");
    assert!(!err.contains("@latest") && !err.contains("npm install -g @courier-codex"), "advice naming what is not published: {err}");
    user.shell_ok(&advice, &user.env().work);
    let out = user.broker_ok(&["--version"], false);
    assert!(out.contains(env!("CARGO_PKG_VERSION")) || out.contains("0.1.0"), "{out}");

    // The README's command, from a checkout where install/package.sh left the tarballs.
    let checkout = root.join("checkout");
    std::fs::create_dir_all(checkout.join("target/package")).unwrap();
    std::os::unix::fs::symlink(platform.parent().unwrap(), checkout.join("target/package/npm")).unwrap();
    user.shell_ok(&readme_npm_line(), &checkout);
    user.broker_ok(&["--version"], false);

    // A damaged package.
    let client = user.vendor_dir().join("hook-client");
    let mut bytes = std::fs::read(&client).unwrap();
    bytes.extend_from_slice(b"\0not what the package listed\n");
    std::fs::write(&client, bytes).unwrap();
    let out = user.broker(&["install", "--start", "none"], false);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}\n{err}", text(&out.stdout));
    assert!(err.contains("does not match its package's SHA256SUMS") && err.contains("npm install -g"), "{err}");
    assert!(!user.local_bin().join("hook-client").exists() && !user.local_bin().join("broker").exists(), "{err}");
    assert!(!user.env().hooks_json_path().exists(), "{err}");
}

/// `cargo install --locked` installs every binary a release ships: the commands docs/install.md
/// gives (`--git URL PACKAGES...`, and `--path DIR` once per package from a clone) name exactly
/// the workspace packages that have a binary, each binary is one install/package.sh packs, and
/// the lock file is current (`--locked`). Building each package on its own, as `cargo install`
/// does, costs minutes here (a feature set of its own per package); that was run by hand.
#[test]
fn cargo_install_in_the_docs_names_every_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(&root).args(["metadata", "--locked", "--offline", "--no-deps", "--format-version", "1"]);
    let out = run_bounded(&mut c, T);
    assert!(out.status.success(), "cargo metadata --locked: {}", text(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Package name -> (its directory, its binaries), for every member with a binary but the
    // test kit's (`publish = false`: never installed).
    let mut with_bins = std::collections::BTreeMap::new();
    for p in meta["packages"].as_array().unwrap().iter().filter(|p| p["publish"] != serde_json::json!([])) {
        let bins: Vec<String> = p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")))
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        if !bins.is_empty() {
            let dir = Path::new(p["manifest_path"].as_str().unwrap()).parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
            with_bins.insert(p["name"].as_str().unwrap().to_string(), (dir, bins));
        }
    }
    let doc = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    let line =
        |start: &str| doc.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no `{start}` in docs/install.md")).to_string();
    let mut git: Vec<String> = line("cargo install --locked --git").split_whitespace().skip(5).map(String::from).collect();
    git.sort();
    assert_eq!(git, with_bins.keys().cloned().collect::<Vec<_>>(), "the --git command names every package with a binary");
    let for_line = line("for p in ");
    let dirs: Vec<&str> = for_line.trim_start_matches("for p in ").split(';').next().unwrap().split_whitespace().collect();
    assert!(for_line.contains("cargo install --locked --path \"$p\""), "{for_line}");
    let mut want_dirs: Vec<&str> = with_bins.values().map(|(d, _)| d.as_str()).collect();
    let mut got_dirs = dirs.clone();
    want_dirs.sort();
    got_dirs.sort();
    assert_eq!(got_dirs, want_dirs, "the --path loop names every package's directory");
    let script = std::fs::read_to_string(root.join("install/package.sh")).unwrap();
    let packed = script.lines().find_map(|l| l.strip_prefix("bins=(")).expect("bins=( in package.sh").trim_end_matches(')').to_string();
    let mut packed: Vec<&str> = packed.split_whitespace().collect();
    let mut bins: Vec<&str> = with_bins.values().flat_map(|(_, b)| b.iter().map(String::as_str)).collect();
    packed.sort();
    bins.sort();
    assert_eq!(packed, bins, "package.sh packs every binary cargo install installs");
}
