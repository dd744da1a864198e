//! `broker install` as a plan of named steps, each writing the manifest ahead of what it puts in
//! place (so `broker uninstall` finds it even after a kill) and saying what it did in the report:
//! [`Run::binaries`], [`Run::hooks_json`], [`Run::trust_handlers`], [`Run::trust_user_codex`],
//! `claude::install_claude` (Claude Code's hooks, port and binaries), [`Run::start_at_login`],
//! [`Run::bridge`]. `install` (mod.rs) journals and undoes them as one.

use super::*;

/// What one install run carries from step to step.
struct Run<'a> {
    opts: &'a InstallOptions,
    state_dir: PathBuf,
    codex_home: PathBuf,
    m: Manifest,
    report: Report,
}

/// The binaries in place (step 1).
struct Binaries {
    broker: PathBuf,
    client: PathBuf,
    /// A binary the broker runs was replaced: a running broker must restart.
    replaced: bool,
    with_mcp: bool,
    with_bridge: bool,
}

pub(super) fn install_run(opts: &InstallOptions, state_dir: &Path) -> Result<Installed> {
    let mut m = load_manifest(state_dir)?.unwrap_or_default();
    m.version = 1;
    let codex_home = absolute(&opts.codex_home)?;
    let mut run = Run { opts, state_dir: state_dir.to_path_buf(), codex_home, m, report: Report::new() };
    let mut bins = run.binaries()?;
    let (command, groups) = run.hooks_json(&bins.client)?;
    run.trust_handlers(&command, &groups, &bins)?;
    let codex_problem = run.trust_user_codex()?;
    // A new hook port is served only by a broker started after it was written.
    bins.replaced |= claude::install_claude(&mut run.m, &run.state_dir, opts.claude, &mut run.report)?;
    let mode = run.start_at_login(&bins)?;
    run.bridge(&bins, mode)?;
    Ok(Installed { report: run.report, codex_problem })
}

impl Run<'_> {
    fn save(&self) -> Result<()> {
        save_manifest(&self.state_dir, &self.m)
    }

    /// Step 1: broker and hook-client (and courier-mcp, the bridge) copied into the prefix from
    /// the build or the package they come from, checked against its sums.
    fn binaries(&mut self) -> Result<Binaries> {
        let (opts, m, report) = (self.opts, &mut self.m, &mut self.report);
        let prefix = absolute(&opts.prefix)?;
        let source = Source::choose(&opts.source_dir, &prefix, m.package.as_deref())?;
        let (src_broker, src_client) = (source.dir.join("broker"), source.dir.join("hook-client"));
        for p in [&src_broker, &src_client] {
            if !p.is_file() {
                bail!("{} not found: install runs from the directory holding both broker and hook-client", p.display());
            }
        }
        let make_prefix = !prefix.exists();
        if make_prefix && (m.prefix != prefix || m.binaries.is_empty()) {
            m.created_prefix = true;
        }
        if !m.prefix.as_os_str().is_empty() && m.prefix != prefix {
            report.push(format!("note: previous install used {}; its binaries stay until you remove them", m.prefix.display()));
        }
        m.prefix = prefix.clone();
        m.package = source.package();
        m.package_sums = source.sums();
        // `broker mcp` runs the courier-mcp beside the installed broker; optional (a build without it).
        let src_mcp = source.dir.join("courier-mcp");
        let with_mcp = opts.mcp && src_mcp.is_file();
        if opts.mcp && !with_mcp {
            report.push(format!("note: no courier-mcp beside {}; `broker mcp` is not installed", src_broker.display()));
        }
        let mut names: Vec<&str> = if with_mcp { vec!["broker", "hook-client", "courier-mcp"] } else { vec!["broker", "hook-client"] };
        // The bridge: asked for now, or installed before (a re-install updates it too).
        if let Some(b) = &opts.bridge {
            b.check()?;
            if !source.dir.join(bridge::BRIDGE_BIN).is_file() {
                bail!(
                    "--bridge: no {} beside {} (build it with `cargo build -p courier-bridge`)",
                    bridge::BRIDGE_BIN,
                    src_broker.display()
                );
            }
        }
        let with_bridge = opts.bridge.is_some() || (m.bridge.is_some() && source.dir.join(bridge::BRIDGE_BIN).is_file());
        if with_bridge {
            names.push(bridge::BRIDGE_BIN);
        }
        for name in names.iter().copied() {
            let dst = prefix.join(name);
            if !m.binaries.contains(&dst) {
                m.binaries.push(dst);
            }
        }
        // Written ahead of every step from here on: what a step may create is listed before it does.
        save_manifest(&self.state_dir, m)?;
        if make_prefix {
            create_dirs(&prefix)?;
        }
        let mut replaced = false;
        for name in names.iter().copied() {
            let dst = prefix.join(name);
            if install_binary(&source.dir.join(name), &dst, source.digest_of(name)?)? {
                report.push(format!("installed {}", dst.display()));
                // A new courier-mcp needs no broker restart (Codex starts it per session).
                replaced |= name != "courier-mcp";
            }
        }
        Ok(Binaries { broker: prefix.join("broker"), client: prefix.join("hook-client"), replaced, with_mcp, with_bridge })
    }

    /// Step 2: the hook-client registered for Courier's events in `hooks.json` (format kept,
    /// earlier Courier commands replaced). Returns the hook command and its groups.
    fn hooks_json(&mut self, client: &Path) -> Result<(String, Vec<(String, usize)>)> {
        let m = &mut self.m;
        create_dirs(&self.codex_home)?;
        m.codex_home = self.codex_home.clone();
        let command = hook_command(client);
        let old_commands = m.commands.clone();
        if !m.commands.contains(&command) {
            m.commands.push(command.clone());
        }
        m.hook_command = command.clone();
        let hooks_path = self.codex_home.join("hooks.json");
        let current = read_opt(&hooks_path)?;
        let mut doc: Value = match &current {
            Some(t) if !t.trim().is_empty() => {
                serde_json::from_str(t).with_context(|| format!("{} is not valid JSON; fix it first", hooks_path.display()))?
            }
            _ => json!({}),
        };
        let groups = merge_hooks(&mut doc, &command, &old_commands, m)?;
        let new_text = json_text(&doc);
        let changed = match &current {
            Some(t) => serde_json::from_str::<Value>(t).ok().as_ref() != Some(&doc),
            None => true,
        };
        if changed {
            track_edit(&mut m.hooks_json, &hooks_path, current.as_deref(), &new_text);
            save_manifest(&self.state_dir, m)?;
            write_atomic(&hooks_path, new_text.as_bytes(), 0o600)?;
            self.report.push(format!("registered {} for {} in {}", command, EVENTS.join(", "), hooks_path.display()));
        }
        Ok((command, groups))
    }

    /// Step 3: Codex's trust entries for those handlers in `config.toml` (and the MCP server).
    fn trust_handlers(&mut self, command: &str, groups: &[(String, usize)], bins: &Binaries) -> Result<()> {
        let m = &mut self.m;
        let source = hooks_source(&self.codex_home);
        let entries: Vec<(String, String)> =
            groups.iter().map(|(ev, idx)| (trust_key(&source, ev, *idx), courier_trust_hash(ev, command))).collect();
        let config_path = self.codex_home.join("config.toml");
        let current = read_opt(&config_path)?;
        let mut tdoc: toml_edit::DocumentMut = current
            .as_deref()
            .unwrap_or("")
            .parse()
            .with_context(|| format!("{} is not valid TOML; fix it first", config_path.display()))?;
        let stale = m.trust_entries.clone();
        add_trust(&mut tdoc, &entries, &stale, m)?;
        if bins.with_mcp {
            mcp::add_mcp(&mut tdoc, &bins.broker, m, &mut self.report)?;
        }
        let new_text = tdoc.to_string();
        if current.as_deref() != Some(new_text.as_str()) {
            track_edit(&mut m.config_toml, &config_path, current.as_deref(), &new_text);
            // Until the file is written the old entries may still be there: list both.
            let mut both = stale.clone();
            both.extend(entries.iter().filter(|e| !stale.contains(e)).cloned());
            m.trust_entries = both;
            save_manifest(&self.state_dir, m)?;
            write_atomic(&config_path, new_text.as_bytes(), 0o600)?;
            self.report.push(format!("trusted Courier's {} hook handlers in {}", entries.len(), config_path.display()));
        }
        m.trust_entries = entries;
        Ok(())
    }

    /// Step 4: the Codex binary the user's `codex` runs, trusted and followed from now on (so
    /// upgrades need no command). Managed-daemon releases are not trusted for being under
    /// CODEX_HOME (tool commands can write there): a real one is a copy of the trusted binary and
    /// passes by its digest (codex/follow.rs). Returns why the user's `codex` cannot be trusted.
    fn trust_user_codex(&mut self) -> Result<Option<String>> {
        let (m, report) = (&mut self.m, &mut self.report);
        let (on_path, found) = user_codex(&self.codex_home, std::env::var_os("PATH").as_deref());
        let mut store = Store::open(&self.state_dir)?;
        if let Some(cmd) = &on_path {
            let cmd = cmd.to_string_lossy().into_owned();
            if store.follow_codex_command(&cmd)? || !m.codex_followed.contains(&cmd) {
                report.push(format!("following {cmd} across Codex upgrades (the broker trusts what it runs)"));
            }
            if !m.codex_followed.contains(&cmd) {
                m.codex_followed.push(cmd);
            }
        }
        for r in found.found.iter().filter(|r| r.layout != codex::Layout::ManagedDaemon) {
            let digest = codex::hash_and_note(&mut store, &r.native)?;
            let path = r.native.to_string_lossy().into_owned();
            let record = codex::TrustedCodex {
                sha256: digest.clone(),
                path: path.clone(),
                version: codex::native::version_beside(&r.native),
                how: codex::TrustHow::Install,
                source: Some(r.command.to_string_lossy().into_owned()),
                added_at: crate::store::now_ms(),
            };
            if store.trust_codex(&record)? {
                report.push(format!("trusted Codex binary {path} (sha256:{digest}), run by {}", r.command.display()));
                m.codex_trusted.push((digest, path));
            }
        }
        drop(store);
        if on_path.is_none() {
            report.push("note: no codex on PATH, so no Codex binary is trusted; after installing Codex run `broker trust-codex` (or `broker install` again)".into());
        }
        Ok(found.problems.first().map(|(cmd, why)| {
            format!(
                "the codex on PATH ({}) cannot be trusted: {why}\nfix: reinstall Codex, or trust its native binary with `broker trust-codex PATH`",
                cmd.display()
            )
        }))
    }

    /// Step 5: the broker started at login (systemd, or the login profile when no user manager
    /// runs), restarted when a binary it runs was replaced. Returns how it starts.
    fn start_at_login(&mut self, bins: &Binaries) -> Result<StartMode> {
        let mode = match self.opts.start {
            StartMode::Auto => match systemd::user_manager_answer() {
                Ok(()) => StartMode::Systemd,
                Err(why) => {
                    // Said when chosen, not on every re-install of the same choice.
                    if !matches!(self.m.start, StartSetup::Profile { .. }) {
                        self.report.push(format!(
                            "starting the broker from the login profile, not systemd: `systemctl --user` has no user manager here \
                             ({why}). Each login shell starts it if none runs; `broker install --start systemd` switches once \
                             a user manager runs"
                        ));
                    }
                    StartMode::Profile
                }
            },
            other => other,
        };
        if mode == StartMode::Systemd {
            for u in [SOCKET_UNIT, SERVICE_UNIT].map(|n| unit_dir().join(n)) {
                if !self.m.unit_files.contains(&u) {
                    self.m.unit_files.push(u);
                }
            }
        }
        self.save()?; // before starting anything: uninstall must find it
        if instance::clear_stop(&self.state_dir)? {
            self.report.push("cleared the stop mark `broker stop` left: the broker starts at login again".into());
        }
        let (broker, codex_home, replaced, report) = (&bins.broker, &self.codex_home, bins.replaced, &mut self.report);
        let start = match mode {
            StartMode::Systemd => setup_systemd(broker, codex_home, replaced, self.opts.no_enable, &self.m.start, report)?,
            StartMode::Profile => setup_profile(broker, codex_home, replaced, &self.m.start, report)?,
            StartMode::None | StartMode::Auto => {
                teardown_start(&self.m.start, broker, report)?;
                StartSetup::None
            }
        };
        self.m.start = start;
        self.save()?;
        Ok(mode)
    }

    /// Step 6: the NATS bridge, configured when asked and started the same way beside the broker.
    fn bridge(&mut self, bins: &Binaries, mode: StartMode) -> Result<()> {
        if let Some(b) = &self.opts.bridge {
            bridge::write_config(&mut self.m, &self.state_dir, b, &mut self.report)?;
        }
        if bins.with_bridge {
            let (m, report) = (&mut self.m, &mut self.report);
            bridge::setup_start(m, &self.state_dir, mode, &bins.broker, &self.codex_home, bins.replaced, self.opts.no_enable, report)?;
        }
        Ok(())
    }
}
