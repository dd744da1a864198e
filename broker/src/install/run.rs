//! `broker install` as a plan of named steps, each writing the manifest ahead of what it puts in
//! place (so `broker uninstall` finds it even after a kill) and saying what it did in the report:
//! [`Run::binaries`], [`Run::host_agents`] (each host agent's row, `agent/`: wanted or taken
//! out, its hooks registered and trusted in its config, its binaries trusted),
//! [`Run::start_at_login`], [`Run::bridge`].
//! `install` (mod.rs) journals and undoes them as one.

use super::agent::{AgentEnv, HostAgent, Registered, Wanted};
use super::carry::{Binaries, Run};
use super::*;

pub(super) fn install_run(opts: &InstallOptions, state_dir: &Path) -> Result<Installed> {
    let mut m = load_manifest(state_dir)?.unwrap_or_default();
    m.version = 1;
    let codex_home = absolute(&opts.codex_home)?;
    let env = AgentEnv::from_process(codex_home);
    let mut run = Run { opts, state_dir: state_dir.to_path_buf(), env, m, report: Report::new() };
    let mut bins = run.binaries()?;
    let codex_problem = run.host_agents(&mut bins)?;
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
        let source = Source::running()?;
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
        if same_file(&source.dir, &prefix) {
            // The installed copy: the package recorded stays recorded (npm's launcher reads it).
            report.extend(package::newer_package(m.package.as_deref(), &m.package_sums));
        } else {
            m.package = source.package();
            m.package_sums = source.sums();
        }
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
            if install_binary(&source.file(name), &dst, source.digest_of(name)?)? {
                report.push(format!("installed {}", dst.display()));
                // A new courier-mcp needs no broker restart (Codex starts it per session).
                replaced |= name != "courier-mcp";
            }
        }
        Ok(Binaries { broker: prefix.join("broker"), client: prefix.join("hook-client"), replaced, with_mcp, with_bridge })
    }

    /// Steps 2 to 4, for each host agent of the table (`agent/`) this run wants: Courier's hooks
    /// registered and trusted in the agent's config, the agent binary the user runs trusted (one
    /// not wanted is taken out). Returns why that binary cannot be trusted.
    fn host_agents(&mut self, bins: &mut Binaries) -> Result<Option<String>> {
        let mut problem = None;
        for agent in HostAgent::ALL {
            if agent.wanted(self)? == Wanted::TakeOut {
                agent.take_out(self)?;
                continue;
            }
            // Hooks on a new port are served only by a broker started after they were written.
            if agent.register_hooks(self, bins)? == Registered::RestartBroker {
                bins.replaced = true;
            }
            let why = agent.trust_binaries(self)?;
            problem = problem.or(why);
        }
        Ok(problem)
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
        let (broker, codex_home, replaced, report) = (&bins.broker, &self.env.codex_home, bins.replaced, &mut self.report);
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
            bridge::setup_start(m, &self.state_dir, mode, &bins.broker, &self.env.codex_home, bins.replaced, self.opts.no_enable, report)?;
        }
        Ok(())
    }
}
