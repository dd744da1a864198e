//! A `broker serve` that tests kill and restart at will (the crash and hostile tests): unlike
//! [`crate::Broker`] it owns no borrowed world, takes extra environment (failpoints, deadlines),
//! can be spawned without waiting, and every start appends to one log, `<root>/broker.log`.

use crate::broker::broker_bin;
use crate::util::poll_until;
use crate::CodexEnv;
use broker_lib::client::query_status;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

pub struct Serve {
    pub child: Child,
    pub log: PathBuf,
}

impl Serve {
    /// Start `broker serve` with `extra` environment; wait (bounded) until it answers status.
    pub fn start(env: &CodexEnv, extra: &[(&str, &str)]) -> Serve {
        let mut s = Serve::spawn(env, extra);
        let ok = poll_until(Duration::from_secs(15), || {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("broker serve exited at start ({st}): {}", s.log_text());
            }
            query_status(&env.runtime_dir)
        });
        assert!(ok.is_some(), "broker did not answer status: {}", s.log_text());
        s
    }

    /// Spawn without waiting.
    pub fn spawn(env: &CodexEnv, extra: &[(&str, &str)]) -> Serve {
        let log = env.root.join("broker.log");
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = env.command(broker_bin());
        cmd.arg("serve").stdout(logf.try_clone().unwrap()).stderr(logf);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Serve { child: cmd.spawn().expect("spawn broker serve"), log }
    }

    /// Every start's stdout and stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}
