#!/usr/bin/env node
// Courier's `broker` command from npm: runs the native broker of the platform package, resolved
// the way @openai/codex resolves its own (an optional dependency per platform). `broker install`
// then copies the native binaries to a stable prefix (~/.local/bin): the hook command Codex
// trusts and the broker started at login never point into node_modules, so a package upgrade
// cannot change or break them.
"use strict";
const { spawn } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const LAUNCHER = "@courier-codex/courier";
const PLATFORMS = {
  "linux x64": { pkg: "@courier-codex/courier-linux-x64", triple: "x86_64-unknown-linux-gnu" },
};

function fail(message) {
  process.stderr.write(`broker: ${message}\n`);
  process.exit(1);
}

function nativeDir() {
  const platform = PLATFORMS[`${process.platform} ${process.arch}`];
  if (!platform) {
    fail(`no native Courier for ${process.platform} ${process.arch}; build it from source (docs/install.md)`);
  }
  let root;
  try {
    root = path.dirname(require.resolve(`${platform.pkg}/package.json`));
  } catch {
    fail(`missing the package ${platform.pkg} (the native binaries) beside this launcher; ${reinstallAdvice(platform.pkg)}`);
  }
  return path.join(root, "vendor", platform.triple, "bin");
}

// What to run to get the platform package. install/package.sh records in this package.json where
// the launcher is meant to come from (`courier.from`): "registry" for a release it publishes,
// else the directory it packed both tarballs in. Never advice naming a file that is not there.
function reinstallAdvice(pkg) {
  const me = require("../package.json");
  const from = (me.courier || {}).from;
  if (from === "registry") {
    return `reinstall it with its optional dependency (npm skips it with --omit=optional): npm install -g ${LAUNCHER}@${me.version}`;
  }
  const tarball = (name) => `${name.replace("@", "").replace("/", "-")}-${me.version}.tgz`;
  const both = [tarball(pkg), tarball(LAUNCHER)].map((t) => (from ? path.join(from, t) : t));
  if (from && both.every((t) => fs.existsSync(t))) {
    return `install both tarballs in one command: npm install -g ${both.join(" ")}`;
  }
  return "install both tarballs install/package.sh makes in one command, from the Courier checkout: " +
    "npm install -g ./target/package/npm/*.tgz (docs/install.md)";
}

// Where `broker install` keeps its manifest (the broker's own rule, shared/src/paths.rs).
function manifestPath() {
  const env = (k) => (process.env[k] ? process.env[k] : null);
  const state = env("COURIER_STATE_DIR") ||
    (env("XDG_STATE_HOME") ? path.join(env("XDG_STATE_HOME"), "courier") : path.join(os.homedir(), ".local/state/courier"));
  return path.join(state, "install-manifest.json");
}

// The package's own SHA256SUMS (name -> digest), written by install/package.sh beside the binaries.
function packageSums(dir) {
  const sums = {};
  for (const line of fs.readFileSync(path.join(dir, "SHA256SUMS"), "utf8").split("\n")) {
    const m = /^([0-9a-f]{64}) [ *]?(\S+)$/.exec(line.trim());
    if (m) sums[m[2]] = m[1];
  }
  return sums;
}

// After a package upgrade the installed copies are the old ones until `broker install` runs again.
// `broker install` records the SHA256SUMS it installed from: comparing the two lists costs two
// small reads, where hashing the binaries cost more than the command itself.
function upgradeHint(dir) {
  try {
    const manifest = JSON.parse(fs.readFileSync(manifestPath(), "utf8"));
    const installed = manifest.package_sums || {};
    const ours = packageSums(dir);
    const stale = Object.keys(ours).some(
      (b) => manifest.binaries.includes(path.join(manifest.prefix, b)) && installed[b] !== ours[b],
    );
    if (stale) {
      // This launcher by the path it was run as: a `broker` earlier on PATH (the installed copy)
      // installs only itself.
      const version = require("../package.json").version;
      process.stderr.write(
        `broker: the Courier in ${manifest.prefix} is not this package's (${version}): run \`${process.argv[1]} install\` ` +
          `to update it (hooks stay trusted)\n`,
      );
    }
  } catch {
    // No install yet, or one this launcher cannot read: nothing to say.
  }
}

const dir = nativeDir();
const args = process.argv.slice(2);
if (!["install", "uninstall"].includes(args[0])) {
  upgradeHint(dir);
}
const child = spawn(path.join(dir, "broker"), args, { stdio: "inherit" });
child.on("error", (err) => fail(`cannot run ${path.join(dir, "broker")}: ${err.message}`));
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(sig, () => {
    if (child.exitCode === null) child.kill(sig);
  });
}
child.on("exit", (code, signal) => {
  if (signal) {
    process.removeAllListeners(signal); // die of the same signal, as the broker did
    process.kill(process.pid, signal);
  } else {
    process.exit(code ?? 1);
  }
});
