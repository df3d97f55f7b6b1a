/**
 * `sandnode upgrade server --from-build DIR`: start a standby server from another build (a
 * checkout with its own node_modules and dist; "." is this one) in the other slot and let it
 * take the node over by handover (AdminService.Handover): same listening sockets, lifecycle
 * calls held for the hold window, sandboxes adopted in place. `--standby`: ask the standby
 * server that already runs to take over (AdminService.Takeover).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { configSlotPath, createSandnodeChannel, createServiceClient, envKey, niceWhileBooting, type TakeoverResult } from '@sandnode/shared';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { mainScript, nodeFor, versionAt, writePidFile, type StackDirs } from './components';
import { spawnDaemon, waitForDaemon } from './daemon-process';
import { listServers, waitForActiveServer } from './lease';

/** Default time an upgrade (of the server or the ublk-manager) may take, ms. */
export const DEFAULT_UPGRADE_TIMEOUT_MS = 120_000;
/** Time {@link findStandbys} gives each admin socket to answer, ms. */
export const DEFAULT_STANDBY_PROBE_TIMEOUT_MS = 1500;
/** Poll interval while the new server's log is read for its takeover line, ms. */
const TAKEOVER_POLL_MS = 20;

/** How long a failed upgrade waits for an ACTIVE server before it says what the node looks like, ms. */
const OUTCOME_WAIT_MS = 3000;
/** The same when another standby of the slot is taking over (its adoption takes a while), ms. */
const SLOT_BUSY_WAIT_MS = 20_000;
/** Exit code of a server whose slot another live server holds (services/server main.ts EXIT_SLOT_BUSY). */
const SERVER_EXIT_SLOT_BUSY = 4;
/**
 * The config the active server runs with, written by each server that becomes active
 * (services/server handover/settings-file.ts SETTINGS_FILE, in the run dir).
 */
export const SERVER_SETTINGS_FILE = 'server-settings.json';
/** Server env vars that are not config keys and still go from the caller to the standby (test and ops hooks). */
const PASSED_SERVER_ENV = ['SANDNODE_SERVER_FAILPOINTS'];

/**
 * standbyEnv is the environment of the standby: the node's settings file as its config (with
 * the caller's SANDNODE_SERVER_* config variables left out, so that they cannot override the
 * node's settings), or, when the active server wrote none (a build before 0.3.0), the caller's
 * environment and listen address as before. The settings file has per-format slots
 * (docs/config.md): a build of 0.3.0 on reads its v2 slot, an older one (a rollback to 0.2.0)
 * reads the v1 slot, which holds only the keys it knows. A settings file without a v2 slot
 * beside it (written by a 0.3.0 development build before the slots) may hold keys 0.2.0
 * refuses: an older build then gets its keys as variables instead.
 */
export function standbyEnv(dirs: StackDirs, callerEnv: NodeJS.ProcessEnv, slot: string, buildDir?: string): NodeJS.ProcessEnv {
  const runDir = path.resolve(dirs.runDir);
  const settings = path.join(runDir, SERVER_SETTINGS_FILE);
  const own = { SANDNODE_SERVER_STATE_DIR: path.resolve(dirs.stateDir), SANDNODE_SERVER_RUN_DIR: runDir, SANDNODE_SERVER_SLOT: slot, SANDNODE_SERVER_TAKEOVER: 'true' };
  if (!existsSync(settings)) return { ...callerEnv, SANDNODE_SERVER_LISTEN: dirs.listen, ...own };
  const env = Object.fromEntries(Object.entries(callerEnv).filter(([k]) => !k.startsWith('SANDNODE_SERVER_') || PASSED_SERVER_ENV.includes(k)));
  if (buildDir && !writesSettingsFile(buildDir) && !existsSync(configSlotPath(settings, 2))) return { ...env, ...settingsAsEnv(settings), ...own };
  return { ...env, SANDNODE_SERVER_CONFIG: settings, ...own };
}

/**
 * writesSettingsFile says whether the server of buildDir is a build that writes (and so reads
 * every key of) the settings file: 0.3.0 on. An older build (a rollback to 0.2.0) refuses a
 * config file with a key it does not know (e.g. `ingressListen`, `dnsUpstreams`).
 */
function writesSettingsFile(buildDir: string): boolean {
  return existsSync(path.join(path.resolve(buildDir), 'services', 'server', 'dist', 'handover', 'settings-file.js'));
}

/**
 * settingsAsEnv gives the settings file's keys as `SANDNODE_SERVER_<KEY>` variables, for a
 * build before 0.3.0: it reads the variables of the keys it knows and ignores the others, so
 * it runs with the node's settings it understands instead of refusing to start.
 */
function settingsAsEnv(file: string): Record<string, string> {
  const { version: _v, ...keys } = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  return Object.fromEntries(Object.entries(keys).map(([k, v]) => [envKey('server', k), typeof v === 'string' ? v : JSON.stringify(v)]));
}

/**
 * The line a server started with SANDNODE_SERVER_TAKEOVER=true prints when the takeover ended
 * (pid: the server that failed; absent in builds before 0.3.0; slotBusy: it exited because
 * another server (holderPid) holds its slot).
 */
type TakeoverLine = TakeoverResult | { takeover: false; error: string; pid?: number; slotBusy?: boolean; holderPid?: number };

/**
 * upgradeServer starts a server from buildDir in the slot the active server does not hold, with
 * the node's settings (the settings file the active server wrote, see standbyEnv), and waits (up to timeoutMs, ms) for the takeover line it logs. Throws Error (saying which server
 * is active afterwards, as the servers' GetLeaseStatus says) when a standby already runs, the
 * build has no server, another upgrade's standby holds the slot (it is taking over), the new
 * server fails or exits before it took the lease, or the time runs out (the new server is then
 * killed). onStep gets a line for each step as it is done (the new server started, the lease and
 * fences taken, serving with its adoption counted), read from the new
 * server's own log lines, for a progress display.
 */
export async function upgradeServer(dirs: StackDirs, buildDir: string, timeoutMs = DEFAULT_UPGRADE_TIMEOUT_MS, onStep: (step: string) => void = () => undefined): Promise<TakeoverResult> {
  // The new server gets the environment as it is at the call (taken before the first await),
  // without the caller's server config variables when the node has a settings file.
  const callerEnv = { ...process.env };
  // A running standby would race the server started here for the lease: use it instead.
  const standbys = await findStandbys(dirs);
  if (standbys.length)
    throw new Error(`a standby server already runs (pid ${standbys[0]?.pid}, version ${standbys[0]?.version}; another upgrade may be taking over with it): upgrade with --standby, or stop it first`);
  const script = mainScript('server', buildDir);
  if (!existsSync(script)) throw new Error(`${script} does not exist: build that checkout first (npm run build in ${path.resolve(buildDir)})`);
  // A handover in progress has no ACTIVE server for a moment: ask again for a while before
  // concluding that none is active.
  const active = await waitForActiveServer(dirs.runDir);
  const holder = { pid: active.holderPid, slot: active.slot };
  const slot = holder.slot === 'b' ? 'a' : 'b';
  const logPath = path.join(path.resolve(dirs.runDir), 'logs', `server-${slot}.log`);
  const child = spawnDaemon({
    script,
    node: nodeFor(buildDir),
    logPath,
    env: standbyEnv(dirs, callerEnv, slot, buildDir),
  });
  // it boots niced, so the active server keeps its CPU; it takes 0 again when it starts the handover
  niceWhileBooting(child.pid);
  onStep(`new server pid ${child.pid} started in slot ${slot} (log ${logPath})`);
  const steps = new StepScanner(logPath, child.logStart, child.pid, onStep);
  // What the node looks like now, for the error: asked of every server, not guessed.
  const now = (waitMs: number) => nodeNow(dirs.runDir, holder.pid, waitMs);
  const line = await waitForDaemon(
    child,
    () => {
      steps.scan();
      return takeoverLine(logPath, child.logStart, child.pid);
    },
    {
      timeoutMs,
      pollMs: TAKEOVER_POLL_MS,
      onExit: (code) =>
        new Error(code === SERVER_EXIT_SLOT_BUSY ? `another standby of slot ${slot} is taking over, so this upgrade started none` : `the new server exited with code ${code}; see ${logPath}`),
      // a new server that hangs must not linger: it is stopped (the old one keeps or retakes the lease)
      killOnTimeout: true,
      onTimeout: () => new Error(`the upgrade did not finish within ${timeoutMs} ms and the new server was stopped; see ${logPath}`),
    },
  ).catch(async (err: Error) => {
    throw new Error(`${err.message}; ${await now(OUTCOME_WAIT_MS)}`);
  });
  if (line.takeover === false) {
    // two upgrades at once: the other one's standby holds the slot and is taking over
    if (line.slotBusy)
      throw new Error(`another standby of slot ${slot}${line.holderPid ? ` (pid ${line.holderPid})` : ''} is taking over, so this upgrade started none; ${await now(SLOT_BUSY_WAIT_MS)}`);
    throw new Error(`the new server did not take the node over: ${line.error}; ${await now(OUTCOME_WAIT_MS)}`);
  }
  writePidFile(dirs, 'server', line.newPid);
  return line;
}

/** poolPart is ' (+ n warm-pool members)' for n > 0 (a number from a log line or a TakeoverResult), else ''. */
export function poolPart(n: unknown): string {
  return typeof n === 'number' && n > 0 ? ` (+ ${n} warm-pool member${n === 1 ? '' : 's'})` : '';
}

/** The new server's log messages that mark a step of its takeover, and how a step line says them. */
const TAKEOVER_STEPS: [msg: string, text: (l: Record<string, unknown>) => string][] = [
  ['epoch fences raised', (l) => `lease taken: epoch ${String(l.epoch)}, peers fenced`],
  ['active', (l) => `serving: ${String(l.adopted)} sandboxes adopted${poolPart(l.pool_members)} in ${String(l.adoption_ms)} ms`],
];

/** StepScanner reports each takeover step of pid's log lines (after byte start) once, in order. */
class StepScanner {
  private readonly seen = new Set<string>();
  constructor(
    private readonly logPath: string,
    private readonly start: number,
    private readonly pid: number,
    private readonly onStep: (step: string) => void,
  ) {}

  scan(): void {
    let text: string;
    try {
      text = readFileSync(this.logPath).subarray(this.start).toString();
    } catch {
      return;
    }
    for (const raw of text.split('\n')) {
      if (!raw.startsWith('{')) continue;
      let l: Record<string, unknown>;
      try {
        l = JSON.parse(raw) as Record<string, unknown>;
      } catch {
        continue;
      }
      if (l.pid !== this.pid || typeof l.msg !== 'string' || this.seen.has(l.msg)) continue;
      const step = TAKEOVER_STEPS.find(([m]) => m === l.msg);
      if (!step) continue;
      this.seen.add(l.msg);
      this.onStep(step[1](l));
    }
  }
}

/**
 * takeoverLine is the first `{"takeover"...}` line of the server pid in logPath after byte
 * offset start; undefined while there is none. (Two servers of one slot write to the same log:
 * the other one's line is not ours.)
 */
function takeoverLine(logPath: string, start: number, pid: number): TakeoverLine | undefined {
  const text = readFileSync(logPath).subarray(start).toString();
  for (const line of text.split('\n')) {
    if (!line.startsWith('{"takeover"')) continue;
    const l = JSON.parse(line) as TakeoverLine;
    const from = l.takeover ? l.newPid : l.pid;
    if (from === undefined || from === pid) return l;
  }
  return undefined;
}

/**
 * nodeNow says which server is active, as the servers answer GetLeaseStatus (waiting up to
 * waitMs, ms, for one to answer ACTIVE: a handover has none for a moment). oldPid: the server
 * that was active before the upgrade.
 */
async function nodeNow(runDir: string, oldPid: number, waitMs: number): Promise<string> {
  const active = await waitForActiveServer(runDir, waitMs).catch(() => undefined);
  if (active?.holderPid === oldPid) return `the old server (pid ${oldPid}) stays active`;
  if (active) return `server pid ${active.holderPid} (slot ${active.slot || '-'}, version ${active.version}, epoch ${active.epoch}) is active now; the old one (pid ${oldPid}) is not`;
  const busy = (await listServers(runDir)).filter((s) => s.role !== 'RETIRING');
  if (busy.length) return `no server answers ACTIVE yet (${busy.map((s) => `slot ${s.slot || '-'}: ${s.role}`).join(', ')}): see sandnode status`;
  return 'no server is active: start one (sandnode up)';
}

/** A running standby server. */
export interface StandbyServer {
  /** its admin address, "unix:///abs/server-b-admin.sock" */
  admin: string;
  /** its own host pid */
  pid: number;
  version: string;
  /** its slot ("a", "b"; "" for a server without one) */
  slot: string;
}

/** findStandbys lists the running servers in STANDBY (k8s: the standby slot's container), each asked within timeoutMs (ms). */
export async function findStandbys(dirs: StackDirs, timeoutMs = DEFAULT_STANDBY_PROBE_TIMEOUT_MS): Promise<StandbyServer[]> {
  const out: StandbyServer[] = [];
  for (const s of await listServers(dirs.runDir, timeoutMs)) {
    if (s.role !== 'STANDBY') continue;
    const v = await versionAt(s.admin, timeoutMs);
    if (v) out.push({ admin: s.admin, pid: v.pid, version: s.version, slot: s.slot });
  }
  return out;
}

/**
 * upgradeServerViaStandby asks the running standby server (e.g. the standby slot's container
 * after its image was updated) to take the node over (AdminService.Takeover, one attempt
 * within timeoutMs, ms). Throws Error when no standby or more than one runs; the ClientError of
 * a failed Takeover propagates.
 */
export async function upgradeServerViaStandby(dirs: StackDirs, timeoutMs = DEFAULT_UPGRADE_TIMEOUT_MS): Promise<TakeoverResult> {
  const standbys = await findStandbys(dirs);
  if (standbys.length === 0) throw new Error('no standby server runs (start one in the standby slot, or use --from-build DIR)');
  if (standbys.length > 1) throw new Error(`${standbys.length} standby servers run (${standbys.map((s) => `pid ${s.pid}`).join(', ')}): stop all but one`);
  const sb = standbys[0]!;
  const ch = createSandnodeChannel(sb.admin);
  try {
    const r = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs, retryAttempts: 1 }).takeover({ holdTimeoutMs: 0, finishTimeoutMs: 0 });
    writePidFile(dirs, 'server', r.newPid);
    return {
      takeover: true,
      oldPid: r.oldPid,
      oldVersion: r.oldVersion,
      newPid: r.newPid,
      newVersion: r.newVersion,
      epoch: Number(r.epoch),
      holdWindowMs: r.holdWindowMs,
      adopted: r.adopted,
      adoptionMs: r.adoptionMs,
      listeners: r.listeners,
      poolMembersAdopted: r.poolMembersAdopted,
    };
  } finally {
    ch.close();
  }
}
