/**
 * The main job (`npm run demo` / `sandnode demo`): a tour of a node that proves the basics on
 * real parts. It runs in its own dirs (below ./.sandnode/demo) so it never touches the node's
 * default state, and ends with nothing left on the host.
 *
 * Steps: up -> template build base -> 3 sandboxes -> a file in each /workspace with its sha256
 * -> a 3-second counting stream in each -> pause/resume one while it counts (same pid, the
 * counter continues) -> kill -9 of the server and a restart (all 3 adopted with the same pids)
 * -> a live server upgrade (handover) during an exec stream -> a live ublk-manager upgrade
 * (device handover) -> delete all -> stop and purge -> check that no loop device, mount, runc container or
 * sandnode process is left. Prints a report with timings; returns false if a check failed.
 */
import { createHash } from 'node:crypto';
import { existsSync, rmSync } from 'node:fs';
import path from 'node:path';
import { run, socketPath, unixAddress } from '@sandnode/shared';
import {
  COMPONENTS,
  connectServer,
  killComponent,
  loopDevicesBelow,
  mountsBelow,
  purgeNode,
  sandnodeProcesses,
  startComponent,
  stateName,
  stopComponent,
  table,
  upgradeServer,
  upgradeUblkManager,
  type ServerApi,
  type StackDirs,
} from '@sandnode/node-stack';
import { ForkMethod } from '@sandnode/shared/proto/server/v1/sandbox';

interface Step {
  step: string;
  ms: number;
  ok: boolean;
  detail: string;
}

const say = (s: string) => process.stdout.write(`${s}\n`);

/** execText runs argv in a sandbox and returns stdout and the exit code. */
async function execText(api: ServerApi, id: string, argv: string[], onLine?: (line: string) => void): Promise<{ out: string; code: number }> {
  let out = '';
  let pending = '';
  let code = -1;
  for await (const ev of api.sandboxes.exec({ sandboxId: id, argv })) {
    const e = ev.event;
    if (e?.$case === 'stdout') {
      const s = Buffer.from(e.value).toString();
      out += s;
      if (onLine) {
        pending += s;
        const lines = pending.split('\n');
        pending = lines.pop() ?? '';
        lines.forEach(onLine);
      }
    } else if (e?.$case === 'exit') code = e.value.exitCode;
  }
  return { out, code };
}

export async function runDemo(base: StackDirs, opts: { keep: boolean }): Promise<boolean> {
  const root = path.resolve(path.dirname(path.resolve(base.stateDir)), 'demo');
  const dirs: StackDirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
  const steps: Step[] = [];
  const step = async (name: string, fn: () => Promise<string>): Promise<void> => {
    const t0 = Date.now();
    say(`\n== ${name}`);
    try {
      const detail = await fn();
      steps.push({ step: name, ms: Date.now() - t0, ok: true, detail });
      say(`   ok (${Date.now() - t0} ms) ${detail}`);
    } catch (err) {
      steps.push({ step: name, ms: Date.now() - t0, ok: false, detail: (err as Error).message });
      say(`   FAILED (${Date.now() - t0} ms): ${(err as Error).message}`);
      throw err;
    }
  };
  say(`sandnode demo: state ${dirs.stateDir}, runtime ${dirs.runDir}`);
  let api: ServerApi | undefined;
  const ids: string[] = [];
  const pids = new Map<string, number>();
  let failed = false;
  try {
    await step('start the stack (vmm-supervisor, ublk-manager, server as separate processes)', async () => {
      const out = [];
      for (const c of COMPONENTS) out.push(`${c} pid ${(await startComponent(dirs, c)).pid}`);
      api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
      return out.join(', ');
    });
    const a = (): ServerApi => api as ServerApi;

    await step('build the base template (busybox-static + Node runtime + podd, no network)', async () => {
      const have = (await a().templates.listTemplates({})).templates.find((t) => t.name === 'base');
      if (have) return `reused (podd ${have.poddVersion})`;
      const t = (await a().templates.buildTemplate({ name: 'base', replace: false })).template!;
      return `${(t.sizeBytes / 1048576).toFixed(1)} MiB, podd ${t.poddVersion}, built in ${t.buildMs} ms`;
    });

    await step('create 3 sandboxes from base', async () => {
      const times: string[] = [];
      await Promise.all(
        [0, 1, 2].map(async (i) => {
          const t0 = Date.now();
          const s = (await a().sandboxes.createSandbox({ template: 'base', metadata: { demo: 'true', n: String(i) } })).sandbox!;
          ids[i] = s.sandboxId;
          pids.set(s.sandboxId, s.pid);
          times[i] = `${s.sandboxId} pid ${s.pid} ${stateName(s.state)} in ${Date.now() - t0} ms`;
        }),
      );
      times.forEach((t) => say(`   ${t}`));
      return '';
    });

    await step('write a file in each /workspace and check its sha256 inside the sandbox', async () => {
      for (const id of ids) {
        const data = Buffer.from(`hello from ${id} at ${new Date().toISOString()}\n`);
        await a().sandboxes.writeFile({ sandboxId: id, path: 'hello.txt', data });
        const want = createHash('sha256').update(data).digest('hex');
        const { out } = await execText(a(), id, ['sha256sum', '/workspace/hello.txt']);
        const got = out.split(/\s+/)[0];
        say(`   ${id} /workspace/hello.txt sha256 ${got}`);
        if (got !== want) throw new Error(`${id}: sha256 inside is ${got}, written ${want}`);
      }
      return 'sha256 inside each sandbox equals the bytes written';
    });

    await step('stream a 3-second counting loop in each sandbox', async () => {
      const results = await Promise.all(
        ids.map((id) => execText(a(), id, ['sh', '-c', 'i=1; while [ $i -le 6 ]; do echo "count $i"; i=$((i+1)); sleep 0.5; done'], (line) => say(`   [${id}] ${line}`))),
      );
      results.forEach((r, i) => {
        if (r.code !== 0 || r.out.trim().split('\n').length !== 6) throw new Error(`${ids[i]}: exit ${r.code}, output ${JSON.stringify(r.out)}`);
      });
      return '6 lines from each, exit 0';
    });

    await step('pause and resume one sandbox while it counts (same pid, the counter continues)', async () => {
      const id = ids[0] as string;
      const stamps: { n: number; t: number }[] = [];
      const counting = execText(a(), id, ['sh', '-c', 'i=1; while [ $i -le 8 ]; do echo $i; i=$((i+1)); sleep 0.25; done'], (line) => {
        stamps.push({ n: Number(line), t: Date.now() });
        say(`   [${id}] ${line}`);
      });
      await new Promise((r) => setTimeout(r, 700));
      const p = (await a().sandboxes.pauseSandbox({ sandboxId: id })).sandbox!;
      say(`   paused: state ${stateName(p.state)}, pid ${p.pid}`);
      await new Promise((r) => setTimeout(r, 1500));
      const r = (await a().sandboxes.resumeSandbox({ sandboxId: id })).sandbox!;
      say(`   resumed: state ${stateName(r.state)}, pid ${r.pid}`);
      const res = await counting;
      const seq = stamps.map((s) => s.n).join(',');
      if (seq !== '1,2,3,4,5,6,7,8' || res.code !== 0) throw new Error(`counter went ${seq}, exit ${res.code}`);
      if (p.pid !== pids.get(id) || r.pid !== pids.get(id)) throw new Error(`pid changed: ${pids.get(id)} -> ${p.pid} -> ${r.pid}`);
      const gap = Math.max(...stamps.slice(1).map((s, i) => s.t - (stamps[i] as { t: number }).t));
      return `counter 1..8 with no gap in the sequence; longest pause between lines ${gap} ms; pid ${r.pid} unchanged`;
    });

    await step('kill -9 the server and start it again: all 3 sandboxes adopted with the same pids', async () => {
      const killed = await killComponent(dirs, 'server');
      say(`   server pid ${killed} killed with SIGKILL`);
      a().close();
      const t0 = Date.now();
      const started = await startComponent(dirs, 'server');
      api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
      say(`   new server pid ${started.pid} answering after ${Date.now() - t0} ms`);
      for (const id of ids) {
        const s = (await a().sandboxes.getSandbox({ sandboxId: id })).sandbox!;
        say(`   ${id} ${stateName(s.state)} pid ${s.pid}`);
        if (s.pid !== pids.get(id) || stateName(s.state) !== 'RUNNING') throw new Error(`${id}: ${stateName(s.state)} pid ${s.pid}, was pid ${pids.get(id)}`);
        const { out } = await execText(a(), id, ['cat', '/workspace/hello.txt']);
        if (!out.startsWith(`hello from ${id}`)) throw new Error(`${id}: /workspace/hello.txt reads ${JSON.stringify(out)}`);
      }
      return 'same pids, state RUNNING, exec and files work';
    });

    await step('upgrade the server live (A/B handover) while a sandbox streams output', async () => {
      const id = ids[1] as string;
      const lines: string[] = [];
      const streaming = execText(a(), id, ['sh', '-c', 'i=1; while [ $i -le 10 ]; do echo "tick $i"; i=$((i+1)); sleep 0.2; done'], (l) => lines.push(l));
      await new Promise((r) => setTimeout(r, 500));
      const r = await upgradeServer(dirs, '.');
      say(`   server ${r.oldVersion} pid ${r.oldPid} -> ${r.newVersion} pid ${r.newPid}, epoch ${r.epoch}, hold window ${r.holdWindowMs} ms, ${r.adopted} adopted`);
      const res = await streaming;
      if (res.code !== 0 || lines.length !== 10) throw new Error(`the stream through the old server ended with exit ${res.code} after ${lines.length}/10 lines`);
      a().close();
      api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
      for (const sid of ids) {
        const s = (await a().sandboxes.getSandbox({ sandboxId: sid })).sandbox!;
        if (s.pid !== pids.get(sid)) throw new Error(`${sid}: pid ${pids.get(sid)} -> ${s.pid}`);
      }
      return 'the stream got all 10 lines through the old server; every sandbox kept its pid';
    });

    await step('upgrade ublk-manager live (device handover to the other slot)', async () => {
      const r = await upgradeUblkManager(dirs, '.');
      say(
        `   slot ${r.oldSlot} pid ${r.oldPid} -> slot ${r.newSlot} pid ${r.newPid}: ${r.devices.length} devices moved (${r.mode}), stall p50 ${r.stallP50Ms.toFixed(1)} ms, p99 ${r.stallP99Ms.toFixed(1)} ms`,
      );
      for (const sid of ids) {
        await a().sandboxes.writeFile({ sandboxId: sid, path: 'after-upgrade.txt', data: Buffer.from(sid) });
        const { out } = await execText(a(), sid, ['cat', '/workspace/after-upgrade.txt', '/workspace/hello.txt']);
        if (!out.startsWith(sid)) throw new Error(`${sid}: /workspace reads ${JSON.stringify(out)} after the device handover`);
      }
      return 'every sandbox writes and reads /workspace after the move';
    });

    await step('fork a running sandbox (freeze, copy-on-write clone, thaw) and check that parent and child are isolated', async () => {
      const parent = ids[0]!;
      const r = await a().sandboxes.forkSandbox({ parentId: parent, metadata: { demo: 'fork' } });
      const child = r.sandbox!.sandboxId;
      try {
        say(`   ${parent} -> ${child} (${ForkMethod[r.method]}): parent held ${r.parentHeldMs} ms, clone ${r.cloneMs} ms, fork ${r.forkMs} ms`);
        const { out } = await execText(a(), child, ['sh', '-c', 'hostname; cat /workspace/hello.txt']);
        const parentHello = (await execText(a(), parent, ['cat', '/workspace/hello.txt'])).out;
        if (out !== `${child}\n${parentHello}`) throw new Error(`${child}: hostname + hello.txt read ${JSON.stringify(out)}`);
        await a().sandboxes.writeFile({ sandboxId: child, path: 'hello.txt', data: Buffer.from('changed in the child\n') });
        if ((await execText(a(), parent, ['cat', '/workspace/hello.txt'])).out !== parentHello) throw new Error(`a write in ${child} reached ${parent}`);
        const p = (await a().sandboxes.getSandbox({ sandboxId: parent })).sandbox!;
        if (stateName(p.state) !== 'RUNNING' || p.pid !== pids.get(parent)) throw new Error(`${parent} after the fork: ${stateName(p.state)} pid ${p.pid}`);
      } finally {
        await a().sandboxes.deleteSandbox({ sandboxId: child });
      }
      return "the child has the parent's /workspace and its own hostname; its writes stay its own; the parent kept running; the child deleted";
    });

    await step('delete all sandboxes', async () => {
      await Promise.all(ids.map((id) => a().sandboxes.deleteSandbox({ sandboxId: id })));
      const left = (await a().sandboxes.listSandboxes({})).sandboxes.length;
      if (left !== 0) throw new Error(`${left} sandboxes left`);
      return `${ids.length} deleted (the fork's child went at the end of its step)`;
    });
  } catch {
    failed = true;
  } finally {
    api?.close();
  }

  if (opts.keep && !failed) {
    say('\n--keep: the stack stays up');
  } else {
    try {
      await step('stop the stack and check that nothing is left', async () => {
        for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c);
        // the ublk-manager's image pool (an XFS file in a loop device, mounted on <stateDir>/images)
        // outlives the ublk-manager by design; removing it is purge's job, not a leftover
        const poolMount = path.join(dirs.stateDir, 'images');
        const poolLoops = loopDevicesBelow(path.join(dirs.stateDir, 'ublk-manager', 'pool'));
        const purge = await purgeNode(dirs);
        const purgedMounts = purge.mounts.filter((m) => m !== poolMount);
        const purgedLoops = purge.loopDevices.filter((d) => !poolLoops.includes(d));
        rmSync(root, { recursive: true, force: true });
        const leftovers: string[] = [];
        const loops = loopDevicesBelow(dirs.stateDir);
        if (loops.length) leftovers.push(`loop devices ${loops.join(' ')}`);
        const mounts = mountsBelow([dirs.runDir, dirs.stateDir]);
        if (mounts.length) leftovers.push(`mounts ${mounts.join(' ')}`);
        const procs = sandnodeProcesses(dirs.runDir);
        if (procs.length) leftovers.push(`processes ${procs.map((p) => p.pid).join(' ')}`);
        const runcList = existsSync(path.join(dirs.runDir, 'runc')) ? (await run('runc', ['--root', path.join(dirs.runDir, 'runc'), 'list', '-q'])).stdout.trim() : '';
        if (runcList) leftovers.push(`runc containers ${runcList}`);
        if (purge.containers.length || purgedMounts.length || purgedLoops.length) {
          leftovers.push(
            `purge had to remove ${purge.containers.length} containers (${purge.containers.join(' ') || '-'}), ${purgedMounts.length} mounts (${purgedMounts.join(' ') || '-'}), ${purgedLoops.length} loop devices (${purgedLoops.join(' ') || '-'})`,
          );
        }
        if (leftovers.length) throw new Error(`left behind: ${leftovers.join('; ')}`);
        return 'no loop device, mount, runc container or sandnode process left';
      });
    } catch {
      failed = true;
    }
  }

  say('\nreport');
  say(
    table(
      ['STEP', 'RESULT', 'MS'],
      steps.map((s) => [s.step, s.ok ? 'ok' : 'FAILED', s.ms]),
    ),
  );
  say(failed ? '\ndemo FAILED' : '\ndemo passed');
  return !failed;
}
