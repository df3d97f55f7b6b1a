/**
 * `sandnode upgrade server --dry-run`: what a server upgrade (or rollback) would do, without
 * doing it: the active server's PrepareHandover for the target's version and features says
 * whether a handover would start now and what the node loses with the target (e.g. a rollback
 * to 0.2.0: the ingress listener, the egress proxy and resolver; kernel network stays).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { versionAt, type StackDirs } from './components';
import { waitForActiveServer } from './lease';
import { findStandbys } from './upgrade';

/** What an upgrade of the server would do now. */
export interface UpgradePreview {
  /** a handover would start now */
  ok: boolean;
  /** why not (empty when ok) */
  reasons: string[];
  /** what the node loses with the target and which sandboxes that affects (PrepareHandover.losses; none from a server before 0.3.0) */
  losses: string[];
  /** sandboxes the target would adopt */
  sandboxes: number;
  /** lifecycle calls running now */
  inFlight: number;
  fromVersion: string;
  toVersion: string;
}

/**
 * buildServerFeatures reads a build's server version and features (its package.json and the
 * SERVER_FEATURES of its built @sandnode/shared). Throws Error when the build has no dist.
 */
export function buildServerFeatures(buildDir: string): { version: string; features: string[] } {
  const dir = path.resolve(buildDir);
  const shared = path.join(dir, 'packages', 'shared', 'dist', 'features.js');
  const version = (): string => (JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8')) as { version?: string }).version ?? '';
  // builds before 0.3.0 (0.2.0: `shared/` layout) list SERVER_FEATURES in the server's handover/server-node.js
  const legacy = path.join(dir, 'services', 'server', 'dist', 'handover', 'server-node.js');
  if (!existsSync(shared) && existsSync(path.join(dir, 'shared', 'dist')) && existsSync(legacy)) return { version: version(), features: legacyServerFeatures(legacy) };
  if (!existsSync(shared)) throw new Error(`${shared} does not exist: build that checkout first (npm run build in ${dir})`);
  const mod = require(shared) as { SERVER_FEATURES?: Record<string, string> };
  return { version: version(), features: Object.values(mod.SERVER_FEATURES ?? {}) };
}

/**
 * legacyServerFeatures reads the `exports.SERVER_FEATURES = [...]` literal of a pre-0.3.0
 * server-node.js (read as text: loading it would load that build's native modules into this
 * Node). Throws Error naming the file when it has none.
 */
function legacyServerFeatures(file: string): string[] {
  const m = /exports\.SERVER_FEATURES\s*=\s*\[([^\]]*)\]/.exec(readFileSync(file, 'utf8'));
  if (!m) throw new Error(`${file} has no SERVER_FEATURES list: not a sandnode server build`);
  return [...m[1]!.matchAll(/['"]([^'"]+)['"]/g)].map((x) => x[1]!);
}

/**
 * previewServerUpgrade asks the active server's PrepareHandover about the target: a build
 * (buildDir) or the running standby (standby: its GetVersion). Throws Error when no server is
 * active, no (or more than one) standby runs, or the build is not built.
 */
export async function previewServerUpgrade(dirs: StackDirs, source: { buildDir: string } | { standby: true }, timeoutMs = 10_000): Promise<UpgradePreview> {
  let target: { version: string; features: string[] };
  if ('buildDir' in source) target = buildServerFeatures(source.buildDir);
  else {
    const standbys = await findStandbys(dirs);
    if (standbys.length !== 1)
      throw new Error(standbys.length ? `${standbys.length} standby servers run: stop all but one` : 'no standby server runs (start one in the standby slot, or use --from-build DIR)');
    const v = await versionAt(standbys[0]!.admin);
    if (!v) throw new Error(`the standby server (pid ${standbys[0]!.pid}) does not answer GetVersion`);
    target = { version: v.version, features: [...v.features] };
  }
  const active = await waitForActiveServer(dirs.runDir);
  const ch = createSandnodeChannel(active.admin);
  try {
    const r = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs, retryAttempts: 1 }).prepareHandover({ standbyVersion: target.version, standbyFeatures: target.features });
    return { ok: r.ok, reasons: [...r.reasons], losses: [...(r.losses ?? [])], sandboxes: r.sandboxes, inFlight: r.inFlight, fromVersion: active.version, toVersion: target.version };
  } finally {
    ch.close();
  }
}
