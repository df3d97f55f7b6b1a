/**
 * The scenario suite, run through the server's public API against a node whose components
 * run assigned builds: create, status, exec, files, pause-resume, fork, network (network-scenario.ts), adoption, delete.
 *
 * A scenario passes, takes its documented fallback, is not applicable (with the reason), or
 * fails with the gRPC status of the failing call and the last lines of the component's log.
 */
import { createHash, randomBytes } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { readlinkSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { ForkMethod } from '@sandnode/shared/proto/server/v1/sandbox';
import { networkScenario } from './network-scenario';
import type { Daemon, ServerApi, TempNode } from './node';
import { nodeFor } from './releases';
import { execCollect, getSandbox, grpcStatusOf, readAll, runScenario, ScenarioError, stateName, type ScenarioBody } from './scenario-kit';
import type { Build, Component, ScenarioResult } from './types';

export * from './scenario-kit';

/** Scenario names in report order. */
export const SCENARIOS = ['create', 'status', 'exec', 'files', 'pause-resume', 'fork', 'network', 'adoption', 'delete'] as const;

/** Features every 0.1.0 component announces; within v1 features are only added (proto/COMPATIBILITY.md). */
export const BASELINE_FEATURES: Record<Component, string[]> = {
  'vmm-supervisor': ['vmm.adoption.v1', 'vmm.epoch-fence.v1', 'vmm.podd-socket-fd.v1', 'vmm.versioned-binaries.v1'],
  'ublk-manager': ['ublk.loop', 'ublk.adoption.v1', 'ublk.slots.v1', 'ublk.handover.v1', 'ublk.epoch-fence.v1'],
  server: ['server.sandbox.v1', 'server.template.v1', 'server.adoption.v1', 'server.handover.v1', 'server.drain.v1', 'server.epoch.v1'],
  podd: ['podd.exec.v1', 'podd.files.v1', 'podd.files.beneath.v1'],
};

/** The feature a server announces when it has the ForkSandbox RPC. */
export const FORK_FEATURE = 'server.fork.v1';
/** The ublk-manager feature ForkSandbox needs (CloneDevice). */
export const CLONE_FEATURE = 'ublk.clone';
/** The podd feature that lets a fork freeze its parent instead of pausing it. */
export const QUIESCE_FEATURE = 'podd.quiesce';

/** A template of the suite and the build of the podd inside it. */
export interface SuiteTemplate {
  name: string;
  podd: Build;
}

/** What the suite runs against. */
export interface SuiteOptions {
  node: TempNode;
  /** the build each daemon is expected to run */
  daemons: Record<Daemon, Build>;
  /** one sandbox per template is created and taken through every scenario */
  templates: SuiteTemplate[];
  /** kill -9 the server and restart the same build (adoption); default true */
  adoption?: boolean;
  /** sandboxes that must keep their pid through adoption (besides the suite's own) */
  watch?: Map<string, number>;
  /** prefix of scenario names (e.g. "after upgrade: ") */
  prefix?: string;
}

/**
 * runSuite runs every scenario against opts.node and returns one result per scenario (the
 * scenarios cover every template's sandbox). The sandboxes it makes are deleted by the
 * delete scenario (or left for the node's purge when an earlier one failed).
 */
export async function runSuite(opts: SuiteOptions): Promise<ScenarioResult[]> {
  const { node } = opts;
  const p = opts.prefix ?? '';
  const results: ScenarioResult[] = [];
  const sbs: { id: string; pid: number; t: SuiteTemplate }[] = [];
  const api = (): ServerApi => node.api;
  const need = () => {
    if (sbs.length !== opts.templates.length) throw new ScenarioError('skipped: create failed');
  };

  results.push(
    await runScenario(node, `${p}create`, 'server', async () => {
      const notes: string[] = [];
      for (const t of opts.templates) {
        const metadata = { compat: 'true', template: t.name, nonce: randomBytes(4).toString('hex') };
        const s = (await api().sandboxes.createSandbox({ template: t.name, metadata, timeoutSeconds: 0, requestId: `compat-${randomBytes(8).toString('hex')}` })).sandbox;
        if (!s) throw new Error('CreateSandbox: empty answer');
        sbs.push({ id: s.sandboxId, pid: s.pid, t });
        if (stateName(s.state) !== 'RUNNING' || s.pid <= 0) throw new ScenarioError(`${s.sandboxId} from ${t.name}: state ${stateName(s.state)} pid ${s.pid}`, 'vmm-supervisor');
        if (JSON.stringify(s.metadata) !== JSON.stringify(metadata)) throw new Error(`${s.sandboxId}: metadata ${JSON.stringify(s.metadata)} != ${JSON.stringify(metadata)}`);
        if (s.poddVersion !== t.podd.version) throw new Error(`${s.sandboxId}: podd_version ${s.poddVersion}, template has ${t.podd.version}`);
        const g = await getSandbox(api(), s.sandboxId);
        if (g.pid !== s.pid || g.state !== s.state) throw new Error(`${s.sandboxId}: GetSandbox says ${stateName(g.state)} pid ${g.pid}, create said pid ${s.pid}`);
        notes.push(`${s.sandboxId} (${t.name}, podd ${t.podd.label}) pid ${s.pid}`);
      }
      return notes.join('; ');
    }),
  );

  results.push(
    await runScenario(node, `${p}status`, 'server', async () => {
      const notes: string[] = [];
      const check = (c: Component, v: { version: string; commit: string; features: string[]; runtime?: string }, b: Build, checkCommit: boolean) => {
        if (v.version !== b.version) throw new ScenarioError(`${c}: version ${v.version}, build ${b.label} is ${b.version}`, c);
        if (checkCommit && v.commit !== b.commit) throw new ScenarioError(`${c}: commit ${v.commit}, build ${b.label} is ${b.commit}`, c);
        const missing = BASELINE_FEATURES[c].filter((f) => !v.features.includes(f));
        if (missing.length) throw new ScenarioError(`${c} ${v.version}: lacks features ${missing.join(', ')} (has ${v.features.join(', ')})`, c);
        notes.push(`${c} ${b.label} ${v.version}@${v.commit.slice(0, 8)} [${v.features.length} features] ${v.runtime || 'runtime not reported'}`);
      };
      // runtime skew is real: each daemon runs on the Node its build was built for
      const checkNode = (c: Daemon, pid: number, b: Build) => {
        const want = realpathSync(nodeFor(b));
        let exe: string;
        try {
          exe = readlinkSync(`/proc/${pid}/exe`);
        } catch (err) {
          throw new ScenarioError(`${c}: cannot read /proc/${pid}/exe: ${(err as Error).message}`, c);
        }
        if (exe !== want) throw new ScenarioError(`${c} (pid ${pid}) runs on ${exe}, build ${b.label} was built for ${want}`, c);
        notes[notes.length - 1] += ` on ${exe}`;
      };
      for (const c of ['server', 'vmm-supervisor', 'ublk-manager'] as Daemon[]) {
        let v;
        try {
          v = await node.version(c);
        } catch (err) {
          throw new ScenarioError(`${c} does not answer GetVersion: ${(err as Error).message}`, c);
        }
        check(c, v, opts.daemons[c], true);
        checkNode(c, v.pid, opts.daemons[c]);
      }
      need();
      for (const s of sbs) {
        let v;
        try {
          v = await node.poddVersion(s.id);
        } catch (err) {
          throw new ScenarioError(`podd of ${s.id} does not answer GetVersion: ${(err as Error).message}`, 'podd');
        }
        // podd's commit is baked into its bundle at build time; the version and features are checked
        check('podd', v, s.t.podd, false);
      }
      return notes.join('; ');
    }),
  );

  results.push(
    await runScenario(node, `${p}exec`, 'podd', async () => {
      need();
      for (const s of sbs) {
        const r = await execCollect(api(), s.id, ['sh', '-c', 'i=1; while [ $i -le 200 ]; do echo "line $i"; i=$((i+1)); done; echo oops >&2; exit 7']);
        const want = Array.from({ length: 200 }, (_, i) => `line ${i + 1}`).join('\n') + '\n';
        if (r.stdout !== want) throw new ScenarioError(`${s.id}: stdout has ${r.stdout.length} bytes, expected ${want.length} (${JSON.stringify(r.stdout.slice(-60))})`, 'podd');
        if (r.stderr !== 'oops\n') throw new ScenarioError(`${s.id}: stderr ${JSON.stringify(r.stderr)}`, 'podd');
        if (r.exitCode !== 7) throw new ScenarioError(`${s.id}: exit code ${r.exitCode}, expected 7`, 'podd');
        if (r.pid <= 0) throw new ScenarioError(`${s.id}: no started event with a pid`, 'podd');
      }
      return `stdout, stderr and exit code 7 from ${sbs.length} sandbox(es)`;
    }),
  );

  results.push(
    await runScenario(node, `${p}files`, 'podd', async () => {
      need();
      for (const s of sbs) {
        const data = randomBytes(200 * 1024);
        await api().sandboxes.writeFile({ sandboxId: s.id, path: 'compat-data.bin', data, mode: 0o644, append: false });
        const back = await readAll(api(), s.id, 'compat-data.bin');
        if (!back.equals(data)) throw new ScenarioError(`${s.id}: ReadFile returned ${back.length} bytes that differ from the ${data.length} written`, 'podd');
        const sha = createHash('sha256').update(data).digest('hex');
        const r = await execCollect(api(), s.id, ['sha256sum', '/workspace/compat-data.bin']);
        if (r.stdout.split(/\s+/)[0] !== sha) throw new ScenarioError(`${s.id}: sha256 inside is ${r.stdout.trim()}, written ${sha}`, 'podd');
      }
      return '200 KiB written, read back and hashed inside';
    }),
  );

  results.push(
    await runScenario(node, `${p}pause-resume`, 'vmm-supervisor', async () => {
      need();
      for (const s of sbs) {
        const paused = (await api().sandboxes.pauseSandbox({ sandboxId: s.id })).sandbox;
        const g = await getSandbox(api(), s.id);
        if (stateName(g.state) !== 'PAUSED' || g.pid !== s.pid || paused?.pid !== s.pid)
          throw new ScenarioError(`${s.id}: after pause ${stateName(g.state)} pid ${g.pid} (was ${s.pid})`, 'vmm-supervisor');
        const resumed = (await api().sandboxes.resumeSandbox({ sandboxId: s.id })).sandbox;
        if (!resumed || stateName(resumed.state) !== 'RUNNING' || resumed.pid !== s.pid)
          throw new ScenarioError(`${s.id}: after resume ${resumed ? stateName(resumed.state) : '?'} pid ${resumed?.pid} (was ${s.pid})`, 'vmm-supervisor');
        const r = await execCollect(api(), s.id, ['echo', 'awake']);
        if (r.stdout !== 'awake\n' || r.exitCode !== 0) throw new ScenarioError(`${s.id}: exec after resume gave ${JSON.stringify(r.stdout)} exit ${r.exitCode}`, 'podd');
      }
      return 'paused and resumed with the same pid; exec works after';
    }),
  );

  results.push(await runScenario(node, `${p}fork`, 'server', async () => forkScenario(opts, sbs[0]?.id)));
  results.push(await runScenario(node, `${p}network`, 'server', async () => networkScenario(node, opts.templates.at(-1)?.name, opts.daemons.server.label)));

  if (opts.adoption !== false) {
    results.push(
      await runScenario(node, `${p}adoption`, 'server', async () => {
        need();
        const b = opts.daemons.server;
        const watch = new Map<string, number>([...(opts.watch ?? new Map<string, number>()), ...sbs.map((s) => [s.id, s.pid] as [string, number])]);
        const before = new Map<string, string>();
        for (const id of watch.keys()) before.set(id, stateName((await getSandbox(api(), id)).state));
        const killed = await node.kill9('server');
        node.api.close();
        await node.start('server', b);
        node.reconnect();
        for (const [id, pid] of watch) {
          const g = await getSandbox(api(), id);
          if (g.pid !== pid || stateName(g.state) !== before.get(id)) throw new Error(`${id}: after adoption ${stateName(g.state)} pid ${g.pid}, was ${before.get(id)} pid ${pid}`);
        }
        for (const s of sbs) {
          const r = await execCollect(api(), s.id, ['cat', '/workspace/compat-data.bin']);
          if (r.exitCode !== 0 || r.stdout.length === 0) throw new ScenarioError(`${s.id}: exec after adoption: exit ${r.exitCode}`, 'podd');
        }
        return `server pid ${killed} killed -9, ${b.label} restarted; ${watch.size} sandbox(es) adopted with the same pids`;
      }),
    );
  }

  results.push(
    await runScenario(node, `${p}delete`, 'server', async () => {
      need();
      for (const s of sbs) {
        await api().sandboxes.deleteSandbox({ sandboxId: s.id });
        try {
          await getSandbox(api(), s.id);
          throw new Error(`${s.id}: GetSandbox still answers after delete`);
        } catch (err) {
          if (grpcStatusOf(err) !== 'NOT_FOUND') throw err;
        }
        const rc = spawnSync('runc', ['--root', path.join(node.dirs.runDir, 'runc'), 'state', s.id], { encoding: 'utf8' });
        if (rc.status === 0) throw new ScenarioError(`${s.id}: runc container still exists after delete`, 'vmm-supervisor');
      }
      return `${sbs.length} deleted: NOT_FOUND, no container left`;
    }),
  );
  return results;
}

/**
 * forkScenario negotiates like the server does, by features (never versions):
 * - server without "server.fork.v1": n/a (no ForkSandbox RPC);
 * - ublk-manager without "ublk.clone": ForkSandbox must fail FAILED_PRECONDITION naming the
 *   component, its version and the feature, and leave nothing made (documented fallback);
 * - podd without "podd.quiesce" (an older template, or a supervisor without the freeze port):
 *   the fork must take the pause path and say so (documented fallback);
 * - else the quiesce path. In both fork paths the child must be RUNNING with the parent's
 *   /workspace, name its parent, and be isolated from it.
 */
async function forkScenario(opts: SuiteOptions, sourceId: string | undefined): Promise<ScenarioBody> {
  const { node } = opts;
  const v = await node.version('server');
  if (!v.features.includes(FORK_FEATURE)) {
    return { result: 'n/a', detail: `server ${opts.daemons.server.label} (${v.version}) lacks feature "${FORK_FEATURE}": no ForkSandbox RPC` };
  }
  if (!sourceId) throw new ScenarioError('skipped: create failed');
  const api = node.api;
  const before = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => s.sandboxId).sort();
  const ublk = await node.version('ublk-manager');
  if (!ublk.features.includes(CLONE_FEATURE)) {
    try {
      await api.sandboxes.forkSandbox({ parentId: sourceId });
    } catch (err) {
      const msg = (err as Error).message;
      if (grpcStatusOf(err) !== 'FAILED_PRECONDITION' || !msg.includes('ublk-manager') || !msg.includes(ublk.version) || !msg.includes(CLONE_FEATURE)) throw err;
      const after = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => s.sandboxId).sort();
      if (JSON.stringify(after) !== JSON.stringify(before)) throw new Error(`refused fork left sandboxes behind: ${after.filter((x) => !before.includes(x)).join(', ')}`, { cause: err });
      return { result: 'fallback', detail: `ublk-manager ${ublk.version} lacks "${CLONE_FEATURE}": ForkSandbox refused with FAILED_PRECONDITION (${msg.replace(/^.*?: /, '')}), nothing made` };
    }
    throw new ScenarioError(`ForkSandbox succeeded although ublk-manager ${ublk.version} lacks "${CLONE_FEATURE}"`, 'ublk-manager');
  }
  const podd = await node.poddVersion(sourceId);
  const quiesce = podd.features.includes(QUIESCE_FEATURE);
  const parent = await getSandbox(api, sourceId);
  const r = await api.sandboxes.forkSandbox({ parentId: sourceId, metadata: { compat: 'fork' } });
  const f = r.sandbox;
  if (!f) throw new Error(`ForkSandbox of ${sourceId}: empty answer`);
  try {
    const want = quiesce ? ForkMethod.FORK_METHOD_QUIESCE : ForkMethod.FORK_METHOD_PAUSE;
    if (r.method !== want) throw new Error(`ForkSandbox method ${ForkMethod[r.method]}, expected ${ForkMethod[want]} (podd ${podd.version} ${quiesce ? 'has' : 'lacks'} "${QUIESCE_FEATURE}")`);
    if (stateName(f.state) !== 'RUNNING' || f.forkedFrom !== sourceId) throw new Error(`child ${f.sandboxId}: ${stateName(f.state)}, forked_from ${JSON.stringify(f.forkedFrom)}`);
    const p = await getSandbox(api, sourceId);
    if (stateName(p.state) !== 'RUNNING' || p.pid !== parent.pid) throw new Error(`parent ${sourceId} after the fork: ${stateName(p.state)} pid ${p.pid} (was ${parent.pid})`);
    const parentData = await readAll(api, sourceId, 'compat-data.bin');
    const childData = await readAll(api, f.sandboxId, 'compat-data.bin');
    if (!childData.equals(parentData)) throw new Error(`child ${f.sandboxId}: /workspace/compat-data.bin differs from the parent's`);
    await api.sandboxes.writeFile({ sandboxId: f.sandboxId, path: 'compat-data.bin', data: Buffer.from('child'), mode: 0o644, append: false });
    if (!(await readAll(api, sourceId, 'compat-data.bin')).equals(parentData)) throw new Error(`a write in child ${f.sandboxId} reached the parent`);
  } finally {
    await api.sandboxes.deleteSandbox({ sandboxId: f.sandboxId });
  }
  const how = quiesce ? `quiesce (parent frozen ${r.parentHeldMs} ms)` : `pause fallback: podd ${podd.version} lacks "${QUIESCE_FEATURE}" (parent paused ${r.parentHeldMs} ms)`;
  return { result: quiesce ? 'pass' : 'fallback', detail: `forked ${sourceId} -> ${f.sandboxId} by ${how}; clone ${r.cloneMs} ms; isolated` };
}

/** cellOutcome folds scenario results: fail if any failed, fallback if any took it, else pass. */
export function cellOutcome(rs: ScenarioResult[]): 'pass' | 'fallback' | 'fail' {
  if (rs.some((r) => r.result === 'fail')) return 'fail';
  if (rs.some((r) => r.result === 'fallback')) return 'fallback';
  return 'pass';
}
