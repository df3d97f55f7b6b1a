/**
 * `sandnode up | down [--purge] | status`: the node's daemons as a whole.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import {
  checkStackDirs,
  COMPONENTS,
  DEFAULT_START_TIMEOUT_MS,
  DEFAULT_STOP_TIMEOUT_MS,
  findActiveServer,
  findRunning,
  getVersion,
  isolationText,
  METRICS_LISTEN_ENV,
  metricsOf,
  metricsText,
  nodeSettings,
  prepareStackDirs,
  purgeNode,
  recordedNote,
  startStack,
  writeNodeSettings,
  startWhatResumeNeeds,
  stopComponent,
  table,
  withNodeLock,
  type Component,
  type NodeSettings,
} from '@sandnode/node-stack';
import { dirsOf, wholeNumber } from '../options';
import { isolationGroups } from '../isolation-groups';
import { EXIT_NOT_RUNNING, action, print } from '../output';
import { OUTPUT_FORMATS, render, type OutputOpts } from '../output-format';
import { paint } from '../terminal';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { keptNodeId } from '@sandnode/shared';
import { requireLocal } from '../local-only';
import { driftWarning, runningDrift } from '../settings-drift';
import { componentPid, pidText, type ComponentPid } from '../component-pid';
import { asRootOnly } from '../root-only';
import { healthLines, nodeHealth } from '../node-health';
import { networkStatusLine, nodeNetwork } from '../node-network';
import { deleteAllSandboxes, purgedNetworkText } from '../purge-sandboxes';
import { listAllSandboxes, withServer } from '../server-calls';
import { holderOf, listeningSockets, listenerFailures, nodeOpens, type ListenerFailure } from '../listening';
import { safeLine, terminalSafe } from '../terminal-safe';

/** Options of a command that only knows --json. */
interface JsonOpts {
  json?: boolean;
}

/** How long `up` / `down` wait for another one on the node to finish, ms: as long as that one may take to start (and undo) every component. */
function lockWaitMs(startTimeoutMs: number): number {
  return COMPONENTS.length * (startTimeoutMs + DEFAULT_STOP_TIMEOUT_MS);
}

/** noActiveServer: what status says when no admin socket answers ACTIVE, naming a server process that runs all the same. */
function noActiveServer(components: { name: string; pid: number | null }[]): string {
  const pid = components.find((c) => c.name === 'server')?.pid;
  return pid ? `none answers on an admin socket, but server pid ${pid} runs: its admin socket is missing or not answering (it binds a removed one again within seconds; else see its log)` : 'none';
}

/**
 * nodeDirsLine: the node's state and run dirs as absolute paths, and the line `up` prints of
 * them (stderr): the defaults (./.sandnode/...) are relative to the directory a command runs in.
 */
export function nodeDirsLine(d: { stateDir: string; runDir: string }): { stateDir: string; runDir: string; text: string } {
  const stateDir = path.resolve(d.stateDir);
  const runDir = path.resolve(d.runDir);
  return { stateDir, runDir, text: `sandnode: this node: state ${stateDir}, run ${runDir} (other commands find it from this directory, or with --state-dir/--run-dir)` };
}

/** registerNodeCommands adds up, down and status to program. */
export function registerNodeCommands(program: Command): void {
  program
    .command('up')
    .description('start vmm-supervisor, ublk-manager and server in the background; returns when all answer (idempotent)')
    .addOption(
      new Option('--start-timeout-ms <ms>', 'how long each component may take to answer, ms (one that started and does not is killed)')
        .env('SANDNODE_START_TIMEOUT_MS')
        .argParser(wholeNumber)
        .default(DEFAULT_START_TIMEOUT_MS),
    )
    .option('--json', 'print JSON')
    .action(
      action(async (o: JsonOpts & { startTimeoutMs: number }, cmd: Command) => {
        // one up or down at a time (node lock); a failure stops what this up started and says so (startStack)
        const d = dirsOf(cmd);
        checkStackDirs(d); // before the node lock is made in runDir
        let settings: NodeSettings | undefined;
        const out = await withNodeLock(d.runDir, lockWaitMs(o.startTimeoutMs), async () => {
          // the daemon settings this up was given become the node's record once it is up (a failed
          // up records nothing); none given: the record's are used (node-settings.ts)
          prepareStackDirs(d);
          settings = nodeSettings(d.stateDir, process.env);
          const started = await startStack(d, { timeoutMs: o.startTimeoutMs });
          if (settings.source === 'caller') writeNodeSettings(d.stateDir, settings.env);
          return started;
        }).catch((err: unknown) => {
          throw asRootOnly('up', err);
        });
        if (settings && out.some((c) => c.started)) process.stderr.write(recordedNote(settings));
        // a server that runs already keeps its settings: say which asked-for ones it does not have (stderr)
        if (out.some((c) => c.name === 'server' && !c.started)) {
          const listen = cmd.getOptionValueSourceWithGlobals?.('listen') === 'default' ? undefined : d.listen;
          process.stderr.write(terminalSafe(driftWarning(runningDrift(d.runDir, listen, process.env))));
        }
        // a network that is off leaves the node up but makes sandboxes without one: say so (stderr), as status does
        const net = await nodeNetwork(d, (await getVersion(d, 'vmm-supervisor'))?.features ?? []);
        if (net && !net.enabled) process.stderr.write(safeLine(`sandnode: warning: ${networkStatusLine(net)}`));
        // what up opened: each daemon's /metrics (its status file; a port in use is said, the daemon runs all the same)
        const all = metricsOf(d.runDir);
        const metrics = Object.fromEntries(out.map((c) => [c.name, all[c.name]?.pid === c.pid ? all[c.name] : undefined]));
        // what each daemon listens on, as the kernel shows it; a listener the server could not open is said (stderr), the node runs without it
        const opens = Object.fromEntries(out.map((c) => [c.name, nodeOpens(listeningSockets(c.pid))]));
        const server = out.find((c) => c.name === 'server');
        const failed = server?.started ? await listenerFailures(server.pid) : [];
        for (const f of failed) process.stderr.write(safeLine(`sandnode: warning: ${listenerFailureText(f)}`));
        // a metrics port taken by another process: said with its holder (the daemon runs and retries the bind)
        for (const c of out) {
          const m = metrics[c.name];
          if (!m || m.url || !/EADDRINUSE/.test(m.error ?? '')) continue;
          const holder = m.listen ? holderOf(m.listen) : '';
          process.stderr.write(
            safeLine(
              `sandnode: warning: ${c.name} cannot serve /metrics on ${m.listen ?? '?'}: the address is taken${holder ? ` by ${holder}` : ''}; it retries. Free it or set ${METRICS_LISTEN_ENV[c.name as Component]}`,
            ),
          );
        }
        // the node's defaults held by something else (most often a first node): one hint with the variables a second node sets
        const held = [
          ...(net && !net.enabled && /overlaps/.test(net.reason) ? ['the network pool'] : []),
          ...failed.filter((f) => f.error === 'EADDRINUSE').map((f) => `the ${f.listener} port`),
          ...out.filter((c) => /EADDRINUSE/.test(metrics[c.name]?.error ?? '') && !metrics[c.name]?.url).map((c) => `the ${c.name} metrics port`),
        ];
        if (held.length) process.stderr.write(safeLine(`sandnode: hint: ${secondNodeHint(held)}`));
        // which node this is: the default dirs are relative, so one run from another directory is another node (newcomer)
        const where = nodeDirsLine(d);
        if (!o.json) process.stderr.write(safeLine(where.text));
        print(
          !!o.json,
          {
            stateDir: where.stateDir,
            runDir: where.runDir,
            components: out.map((c) => ({
              ...c,
              metrics: metrics[c.name]?.url ?? null,
              metricsError: metrics[c.name] && !metrics[c.name]?.url ? (metrics[c.name]?.error ?? null) : null,
              opens: opens[c.name] ?? [],
              ...(c.name === 'server' ? { listenerFailures: failed } : {}),
            })),
          },
          () =>
            table(
              ['COMPONENT', 'PID', 'ACTION', 'MS', 'METRICS', 'OPENS'],
              out.map((c) => [c.name, c.pid, c.started ? 'started' : 'already running', c.ms, metricsText(metrics[c.name]), (opens[c.name] ?? []).join(', ') || '-']),
            ),
        );
      }),
    );

  program
    .command('down')
    .description('stop the daemons; sandboxes keep running (--purge: delete every sandbox, device, mount and dir)')
    .option('--purge', 'remove everything: sandboxes, devices, mounts, dirs')
    .option('--json', 'print JSON')
    .action(
      action(async (o: JsonOpts & { purge?: boolean }, cmd: Command) => {
        const d = dirsOf(cmd);
        const down = async () => {
          const deleted: string[] = [];
          const startedForPurge: string[] = [];
          // NOT_FOUND on a delete: gone already (counted as deleted); any other failure stops down before it stops anything
          if (o.purge && findRunning(d, 'server')) {
            // a drain stopped the ublk-manager: the server's deletes need it (it detaches and removes the drained disks), so start it (and whatever else is missing) first
            for (const c of await startWhatResumeNeeds(d)) {
              startedForPurge.push(c.name);
              process.stderr.write(`sandnode: started ${c.name} (pid ${c.pid}) for the purge: it was not running (a drain stops the ublk-manager)\n`);
            }
            const r = await withServer(d, deleteAllSandboxes);
            deleted.push(...r.deleted, ...r.gone);
          }
          const stopped: string[] = [];
          for (const c of [...COMPONENTS].reverse()) if (await stopComponent(d, c)) stopped.push(c);
          return { deleted, stopped, startedForPurge, purge: o.purge ? await purgeNode(d) : undefined };
        };
        // a run dir another user made or may write: refuse before its pid files or up.lock are used (attacker: root killed the pid a user wrote)
        if (existsSync(d.runDir)) checkStackDirs(d);
        // one up or down at a time (node lock); a node without a run dir has nothing to lock
        const { deleted, stopped, startedForPurge, purge } = await (existsSync(d.runDir) ? withNodeLock(d.runDir, lockWaitMs(DEFAULT_START_TIMEOUT_MS), down) : down()).catch((err: unknown) => {
          throw asRootOnly('down', err);
        });
        print(!!o.json, { stopped, deleted, purge, ...(startedForPurge.length ? { startedForPurge } : {}) }, () =>
          [
            `stopped: ${stopped.join(', ') || 'nothing was running'}`,
            ...(o.purge
              ? [
                  `deleted sandboxes: ${deleted.length}`,
                  `removed containers: ${purge?.containers.length ?? 0}, mounts: ${purge?.mounts.length ?? 0}, loop devices: ${purge?.loopDevices.length ?? 0}, dirs: ${purge?.dirs.join(' ') || 'none'}`,
                  ...(purge?.network ? [purgedNetworkText(purge.network)] : []),
                  ...(purge?.watchdogPid ? [`stopped the freeze watchdog (pid ${purge.watchdogPid})`] : []),
                  ...(purge?.kept ?? []).map((k) => `kept ${k.path}: ${k.why}`),
                ]
              : ['sandboxes keep running; `sandnode up` adopts them']),
          ].join('\n'),
        );
      }),
    );

  program
    .command('status')
    .description(
      "show the components (version, pid, metrics URL, features), the number of sandboxes, whether the sandbox network is on (and why not), each peer's fence epoch, every quarantined row (count and reason per component) and each listener the server could not open; exits 3 when a component is down or no server is active",
    )
    .option('--json', 'print JSON')
    .addOption(
      new Option(
        '-o, --output <format>',
        'json: the --json document (status has no one response message); yaml: the same as YAML; wide: lists the features (the table counts them) and adds the node id',
      ).choices(OUTPUT_FORMATS),
    )
    .action(
      action(async (o: OutputOpts, cmd: Command) => {
        // status reads this node's sockets and pid files: an --address would be used for the sandbox count only
        requireLocal(cmd, 'status');
        const d = dirsOf(cmd);
        const components: ({ name: string; version: string | null; nodeId: string | null; features: string[]; up: boolean; metrics: string | null; metricsError: string | null } & ComponentPid)[] = [];
        const metrics = metricsOf(d.runDir);
        for (const c of COMPONENTS) {
          const v = await getVersion(d, c);
          // a pid only for a live process: a pid file left by one that died is shown as stale; a metrics URL only from the status file of the process that answers
          const m = v && metrics[c]?.pid === v.pid ? metrics[c] : undefined;
          components.push({
            name: c,
            version: v?.version ?? null,
            nodeId: v ? v.nodeId || null : null,
            ...componentPid(d, c, v?.pid),
            features: v?.features ?? [],
            up: !!v,
            metrics: m?.url ?? null,
            metricsError: m && !m.url ? (m.error ?? 'not bound yet') : null,
          });
        }
        const node = nodeIdentity(components, keptNodeId(d.stateDir));
        const all = components.find((c) => c.name === 'server')?.up ? await withServer(d, (api) => listAllSandboxes(api)) : null;
        const sandboxes = all?.length ?? null;
        const isolation = all ? isolationGroups(all) : null;
        const active = await findActiveServer(d.runDir);
        const server = active ? { slot: active.slot, pid: active.holderPid, version: active.version } : null;
        const epoch = active?.epoch ?? null;
        const health = await nodeHealth(d, active?.admin ?? null, epoch, Object.fromEntries(components.map((c) => [c.name, c.features])));
        const quarantine = Object.fromEntries(health.map((h) => [h.name, h.quarantined === null ? null : { count: h.quarantined.length, rows: h.quarantined }]));
        const vmm = health.find((h) => h.name === 'vmm-supervisor');
        quarantine['vmm-supervisor network slots'] = vmm?.slotQuarantined ? { count: vmm.slotQuarantined.length, rows: vmm.slotQuarantined } : null;
        const fences = Object.fromEntries(health.filter((h) => h.name !== 'server').map((h) => [h.name, { epoch: h.fenceEpoch, aboveServer: h.fencedAboveServer }]));
        const networkMismatches = health.find((h) => h.name === 'server')?.networkMismatches ?? null;
        const network = await nodeNetwork(d, components.find((c) => c.name === 'vmm-supervisor')?.features ?? []);
        // the listeners the active server could not open (its log; up says it too): the node runs without them
        const listenerFailed = active ? await listenerFailures(active.holderPid, 0) : [];
        const doc = { nodeId: node.nodeId, components, sandboxes, isolation, epoch, server, fences, quarantine, networkMismatches, network, listenerFailures: listenerFailed };
        const drained = all ? all.filter((s) => s.state === SandboxState.SANDBOX_STATE_DRAINED).length : 0;
        // the device manager a drain stopped (its pid file removed by the drain, or left stale) is stopped, not down
        const stoppedByDrain = (c: (typeof components)[number]) => !c.up && c.name === 'ublk-manager' && drained > 0;
        const statusText = (c: (typeof components)[number]) => (c.up ? paint('green', 'up') : stoppedByDrain(c) ? 'stopped' : paint(c.stalePid ? 'red' : 'yellow', 'down'));
        const pidCol = (c: (typeof components)[number]) => (stoppedByDrain(c) ? `- (stopped by the drain of ${drained} sandboxes; \`sandbox resume\` starts it)` : pidText(c));
        const lines = (wide: boolean) =>
          [
            node.text,
            table(
              ['COMPONENT', 'STATUS', 'VERSION', 'PID', 'METRICS', 'FEATURES', ...(wide ? ['NODE ID'] : [])],
              components.map((c) => [
                c.name,
                statusText(c),
                c.version ?? '-',
                pidCol(c),
                c.metrics ?? (c.metricsError ? `not served (${c.metricsError})` : '-'),
                // the list is long (20+ names per component): counted here, listed by -o wide and --json
                wide ? c.features.join(',') : String(c.features.length),
                ...(wide ? [c.nodeId ?? '-'] : []),
              ]),
            ),
            `sandboxes: ${sandboxes ?? 'unknown (the server is down; the sandboxes it had, if any, keep running)'}${drained ? ` (${drained} DRAINED: \`sandnode sandbox resume ID\` boots one again)` : ''}`,
            ...(isolation ?? []).map((g) => `  isolation ${isolationText(g.isolation)}: ${g.sandboxes.length} (${g.sandboxes.join(', ')})`),
            `epoch: ${epoch ?? '-'}; active server: ${server ? `${server.slot ? `slot ${server.slot}, ` : ''}pid ${server.pid}, version ${server.version}` : noActiveServer(components)}`,
            networkStatusLine(network),
            ...listenerFailed.map((f) => paint('yellow', `listener off: ${listenerFailureText(f)}`)),
            ...healthLines(health, epoch),
          ].join('\n');
        render(o, { json: doc, human: () => lines(false), wide: () => lines(true) });
        // scripts ask `sandnode status` whether the node runs: every component up (a device manager stopped by a drain counts) and a server active
        const down = components.filter((c) => !c.up && !stoppedByDrain(c));
        if (down.length || !server) process.exitCode = EXIT_NOT_RUNNING;
      }),
    );
}

/**
 * nodeIdentity is the node's id as its components report it (GetVersion node_id): the id they
 * agree on (null when none answers with one) and the line `status` prints, which names every
 * component that disagrees (a misconfigured SANDNODE_NODE_ID).
 */
export function nodeIdentity(components: { name: string; nodeId: string | null }[], kept?: string): { nodeId: string | null; text: string } {
  const said = components.filter((c): c is { name: string; nodeId: string } => !!c.nodeId);
  const ids = [...new Set(said.map((c) => c.nodeId))];
  const first = ids[0];
  // every component down (or too old to say): the id the node keeps in its state dir, said as such
  if (first === undefined && kept) return { nodeId: kept, text: `node: ${kept} (kept in <stateDir>/node-id; no component is up to report it)` };
  if (first === undefined) return { nodeId: null, text: 'node: unknown (no component reports a node id)' };
  if (ids.length === 1) return { nodeId: first, text: `node: ${first}` };
  const server = said.find((c) => c.name === 'server')?.nodeId ?? first;
  return { nodeId: server, text: `node: ${server}; MISMATCH: ${said.map((c) => `${c.name} says ${c.nodeId}`).join(', ')} (check SANDNODE_NODE_ID and <stateDir>/node-id)` };
}

/** The settings of a second node beside a first one on its defaults (README "A second node beside the first"; the README shows these very values). */
export const SECOND_NODE_ENV =
  'SANDNODE_VMM_SUPERVISOR_NETWORK_POOL=10.210.0.0/24 SANDNODE_VMM_SUPERVISOR_DNS_PORT=15153 SANDNODE_VMM_SUPERVISOR_EGRESS_PROXY_PORT=15180 SANDNODE_SERVER_INGRESS_LISTEN=127.0.0.1:8481 SANDNODE_SERVER_METRICS_LISTEN=127.0.0.1:9474 SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN=127.0.0.1:9475 SANDNODE_UBLK_MANAGER_METRICS_LISTEN=127.0.0.1:9476';

/** secondNodeHint: what `up` says when defaults of this node are held elsewhere (`held`: what, e.g. "the ingress port"), pointing to the second-node settings. */
export function secondNodeHint(held: readonly string[]): string {
  return `${held.join(', ')} of this node ${held.length === 1 ? 'is' : 'are'} held elsewhere (often another sandnode node on the defaults). A second node beside the first needs its own pool and ports (README: "A second node beside the first"), e.g. sandnode down, then: ${SECOND_NODE_ENV} sandnode --state-dir ... --run-dir ... up`;
}

/** listenerFailureText says which listener the server could not open, why, and what to do. */
export function listenerFailureText(f: ListenerFailure): string {
  const key = f.listener === 'ingress' ? 'SANDNODE_SERVER_INGRESS_LISTEN (config ingressListen; "" turns it off)' : 'its address in the node config';
  const taken = f.error === 'EADDRINUSE' ? `the address is taken${((h) => (h ? ` by ${h}` : ''))(holderOf(f.address))}` : f.error;
  return `the server could not open its ${f.listener} listener on ${f.address} (${taken}); the node runs without it. Free the address or set ${key}, then: sandnode down && sandnode up`;
}
