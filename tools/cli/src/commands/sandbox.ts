/**
 * `sandnode sandbox create | list | get | exec | pause | resume | fork | reset-rootfs | delete |
 * set-timeout | network | url | keepalive`: one node's sandboxes (network and url: sandbox-network.ts; keepalive and the idle flags of create: sandbox-idle.ts). Every command that answers with a sandbox prints its
 * {@link SandboxJson} with --json.
 */
import { randomBytes } from 'node:crypto';
import type { Command } from 'commander';
import { isolationText, nodeSettings, recordedNote, sandboxJson, startWhatResumeNeeds, table, type SandboxJson, type ServerApi } from '@sandnode/node-stack';
import { ClientError, Status } from 'nice-grpc-common';
import { ForkMethod, GetSandboxResponse, ListSandboxesResponse, SandboxState, type CreateSandboxResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { dirsOf, keyValue, oneOf, wholeNumber } from '../options';
import { action, print, UsageError } from '../output';
import { addOutputOptions, render, type OutputOpts } from '../output-format';
import { listAllSandboxes, withServer } from '../server-calls';
import { addIdleFlags, idleLine, idleRequest, registerIdleCommands, type IdleFlags } from './sandbox-idle';
import { addNetworkFlags, allowOutNote, networkLine, networkRequest, registerNetworkCommands, tokenText, type NetworkFlags } from './sandbox-network';
import { requireServerFeatures, type FeatureNeed } from '../server-features';
import { mapLimit, SERVER_FEATURES } from '@sandnode/shared';

/** The state names `sandbox list --state` takes: RUNNING, PAUSED, ... */
const STATE_NAMES = Object.keys(SandboxState)
  .filter((k) => k.startsWith('SANDBOX_STATE_') && k !== 'SANDBOX_STATE_UNSPECIFIED')
  .map((k) => k.replace('SANDBOX_STATE_', ''));

/** Options of a command that only knows --json. */
interface JsonOpts {
  json?: boolean;
}

/** forkMethodName is the CLI's word for how a fork held its parent. */
export function forkMethodName(m: ForkMethod): string {
  switch (m) {
    case ForkMethod.FORK_METHOD_QUIESCE:
      return 'quiesce';
    case ForkMethod.FORK_METHOD_PAUSE:
      return 'pause';
    case ForkMethod.FORK_METHOD_PAUSED_PARENT:
      return 'paused-parent';
    default:
      return 'existing';
  }
}

/**
 * flagNeeds is what the flags of `create` (or `fork`) need of the server (server-features.ts):
 * the idle flags server.idle.v1 (a fork's: server.fork-idle.v1), --env server.sandbox-env.v1,
 * the network policy flags server.network.v1. --no-network needs nothing: an older server's
 * sandboxes have no network.
 */
export function flagNeeds(o: NetworkFlags & IdleFlags & { env?: Record<string, string> }, fork: boolean): FeatureNeed[] {
  const needs: FeatureNeed[] = [];
  const idleFlag: [keyof IdleFlags, string][] = [
    ['pauseAfterS', '--pause-after-s'],
    ['hibernateAfterS', '--hibernate-after-s'],
    ['pausedTtlS', '--paused-ttl-s'],
  ];
  for (const [k, flag] of idleFlag) if (o[k] !== undefined) needs.push({ feature: fork ? SERVER_FEATURES.forkIdle : SERVER_FEATURES.idle, what: flag });
  if (o.autoResume === false) needs.push({ feature: fork ? SERVER_FEATURES.forkIdle : SERVER_FEATURES.idle, what: '--no-auto-resume' });
  if (!fork && o.env && Object.keys(o.env).length) needs.push({ feature: SERVER_FEATURES.sandboxEnv, what: '--env' });
  if (o.allowOut?.length) needs.push({ feature: SERVER_FEATURES.network, what: '--allow-out' });
  if (o.denyOut?.length) needs.push({ feature: SERVER_FEATURES.network, what: '--deny-out' });
  if (o.blockAll) needs.push({ feature: SERVER_FEATURES.network, what: '--block-all' });
  if (o.public) needs.push({ feature: SERVER_FEATURES.network, what: '--public' });
  return needs;
}

/**
 * createdText is the last line of `sandbox create`: how long the create took and whether it
 * came from the warm pool, or, when the server says the request_id named an earlier create
 * (CreateSandboxResponse.repeat) and the id was the user's own (--request-id), that nothing was
 * created. With the CLI's own id a repeat can only be the client's retry of this call (on
 * UNAVAILABLE) joining the create it had sent.
 */
export function createdText(r: Pick<CreateSandboxResponse, 'createMs' | 'fromPool' | 'poolMiss' | 'repeat'>, givenRequestId: string): string {
  if (r.repeat && givenRequestId) return `already created by an earlier create with request id ${givenRequestId}: nothing new was created`;
  const from = r.fromPool ? ' (from the warm pool)' : r.poolMiss ? ` (cold: ${r.poolMiss})` : '';
  return `created in ${r.createMs} ms${from}${r.repeat ? ' (after a retry that joined the create)' : ''}`;
}

/** requestIdOr is the given idempotency key, or a fresh "cli-<16 hex>": always one, so that the client's retry on UNAVAILABLE cannot create (or fork) twice. */
function requestIdOr(given: string | undefined): string {
  // an empty --request-id is none: the CLI's own then (without one, a retry could create twice)
  return given || `cli-${randomBytes(8).toString('hex')}`;
}

/** oneLine is how a sandbox is shown after a command that changed it. */
function oneLine(s: SandboxJson): string {
  return `${s.id} ${s.state} pid ${s.pid}`;
}

/** registerSandboxCommands adds the `sandbox` commands to program (exec: see registerExecCommand). */
export function registerSandboxCommands(program: Command): Command {
  const sandbox = program.command('sandbox').description('create, inspect, run commands in, pause, resume and delete sandboxes');

  addIdleFlags(
    addNetworkFlags(
      sandbox
        .command('create')
        .description(
          'create a sandbox from a template and start it; it gets a network where the node has one (--allow-out, --deny-out, --block-all, --public, --no-network) and its ingress access token is printed once',
        )
        .requiredOption('--template <name>', 'template name', 'base')
        .option('--timeout <seconds>', 'lifetime in seconds (0: none)', wholeNumber, 0)
        .option('--metadata <key=value>', 'label (repeatable)', keyValue, {})
        .option('--env <NAME=VALUE>', "environment variable of every command run in the sandbox (repeatable; exec's own --env wins; kept by forks; shown by name only)", keyValue, {})
        .option('--vcpus <n>', "virtual CPUs (0: the node's default, defaultVcpus: 1 unless configured)", wholeNumber, 0)
        .option('--memory-mib <n>', "memory limit in MiB (0: the node's default, defaultMemoryMib: 512 unless configured)", wholeNumber, 0)
        .option('--disk-bytes <n>', "/workspace size in bytes (0: the node's default, defaultDiskBytes: 1 GiB unless configured)", wholeNumber, 0)
        .option('--request-id <id>', 'idempotency key')
        .option('--json', 'print JSON'),
    ),
  ).action(
    action(
      async (
        o: JsonOpts &
          NetworkFlags &
          IdleFlags & { template: string; timeout: number; metadata: Record<string, string>; env: Record<string, string>; vcpus: number; memoryMib: number; diskBytes: number; requestId?: string },
        cmd: Command,
      ) => {
        const network = networkRequest(o);
        const note = allowOutNote(o);
        if (note && !o.json) process.stderr.write(note);
        const idle = idleRequest(o);
        const needs = flagNeeds(o, false);
        const r = await withServer(dirsOf(cmd), async (api) => {
          await requireServerFeatures(api, needs);
          return api.sandboxes.createSandbox({
            template: o.template,
            timeoutSeconds: o.timeout,
            metadata: o.metadata,
            resources: { vcpus: o.vcpus, memoryMib: o.memoryMib, diskBytes: o.diskBytes },
            requestId: requestIdOr(o.requestId),
            network,
            idle,
            env: o.env,
          });
        });
        const s = sandboxJson(r.sandbox!);
        // the access token is shown once: the server keeps only its hash
        const pool = { from_pool: r.fromPool, create_ms: r.createMs, pool_miss: r.poolMiss, repeat: r.repeat };
        const how = createdText(r, o.requestId ?? '');
        print(!!o.json, { ...s, access_token: r.accessToken, ...pool }, () =>
          [oneLine(s), networkLine(s.network), idleLine(s.idle), tokenText(r.accessToken, r.repeat, !!s.network?.public), how].filter(Boolean).join('\n'),
        );
      },
    ),
  );

  addOutputOptions(
    sandbox
      .command('list')
      .description('list the sandboxes (id, state, pid, template, creation time; -o wide: address, expiry, fork parent, labels)')
      .option('--state <state>', `only this state (${STATE_NAMES.join(', ')})`, oneOf(STATE_NAMES))
      .option('--metadata <key=value>', 'only with this label (repeatable)', keyValue, {}),
  ).action(
    action(async (o: OutputOpts & { state?: string; metadata: Record<string, string> }, cmd: Command) => {
      const states = o.state ? [SandboxState[`SANDBOX_STATE_${o.state}` as keyof typeof SandboxState]] : [];
      const raw = await withServer(dirsOf(cmd), (api) => listAllSandboxes(api, { states, metadata: o.metadata }));
      const all = raw.map(sandboxJson);
      render(o, {
        json: all,
        proto: () => ListSandboxesResponse.toJSON({ sandboxes: raw, nextPageToken: '' }),
        human: () =>
          table(
            ['ID', 'STATE', 'PID', 'TEMPLATE', 'CREATED'],
            all.map((s) => [s.id, s.state, s.pid, s.template, s.created_at]),
          ),
        wide: () =>
          table(
            ['ID', 'STATE', 'PID', 'TEMPLATE', 'CREATED', 'ADDRESS', 'EXPIRES', 'FORKED FROM', 'METADATA'],
            all.map((s) => [
              s.id,
              s.state,
              s.pid,
              s.template,
              s.created_at,
              s.network?.address ?? '-',
              s.expires_at ?? '-',
              s.forked_from || '-',
              Object.entries(s.metadata)
                .map(([k, v]) => `${k}=${v}`)
                .join(',') || '-',
            ]),
          ),
      });
    }),
  );

  addOutputOptions(sandbox.command('get <id>').description('show one sandbox: state, resources, isolation, network')).action(
    action(async (id: string, o: OutputOpts, cmd: Command) => {
      const r = await withServer(dirsOf(cmd), (api) => api.sandboxes.getSandbox({ sandboxId: id }));
      const s = sandboxJson(r.sandbox!);
      const width = Math.max(...Object.keys(s).map((k) => k.length));
      const human = () =>
        Object.entries(s)
          .map(([k, v]) => `${k.padEnd(width)} ${getValueText(k, v, s)}`)
          .join('\n');
      render(o, { json: s, proto: () => GetSandboxResponse.toJSON(r), human });
    }),
  );

  sandbox
    .command('pause <id>')
    .description('freeze a RUNNING sandbox (cgroup freezer); its ingress answers 503 until resumed')
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, o: JsonOpts, cmd: Command) => {
        const s = sandboxJson((await withServer(dirsOf(cmd), (api) => api.sandboxes.pauseSandbox({ sandboxId: id }))).sandbox!);
        print(!!o.json, s, () => oneLine(s));
      }),
    );

  sandbox
    .command('resume [id]')
    .description(
      'thaw a PAUSED sandbox, or boot a DRAINED one again on its disks; on this node it first starts the daemons that are not running (a drain stops the ublk-manager), so no `up` is needed after a drain. --all-drained: every DRAINED sandbox a drain left (not the hibernated ones: they wake on their next use)',
    )
    .option('--all-drained', 'resume every sandbox a drain left DRAINED (4 at a time); exit 1 when one fails')
    .option('--json', 'print JSON')
    .action(
      action(async (id: string | undefined, o: JsonOpts & { allDrained?: boolean }, cmd: Command) => {
        if (!!id === !!o.allDrained) throw new UsageError('resume: give a sandbox id or --all-drained (one of them)');
        const d = dirsOf(cmd);
        // only the local node's daemons: with --address the server may be another machine's
        if (cmd.optsWithGlobals<{ address?: string }>().address === undefined) {
          const started = await startWhatResumeNeeds(d);
          for (const c of started) process.stderr.write(`sandnode: started ${c.name} (pid ${c.pid}) for the resume: it was not running (a drain stops the ublk-manager)\n`);
          // with which settings, as up says it (newcomer: resume did use the recorded ones, silently)
          if (started.length) process.stderr.write(recordedNote(nodeSettings(d.stateDir, process.env)));
        }
        if (id) {
          const s = sandboxJson((await withServer(d, (api) => api.sandboxes.resumeSandbox({ sandboxId: id }))).sandbox!);
          print(!!o.json, s, () => oneLine(s));
          return;
        }
        const done = await withServer(d, async (api) => resumeAllDrained(api));
        print(!!o.json, done, () => resumeAllText(done));
        if (done.failed.length) process.exitCode = 1;
      }),
    );

  addNetworkFlags(
    addIdleFlags(
      sandbox
        .command('fork <id>')
        .description(
          "fork a RUNNING or PAUSED sandbox: a new sandbox from crash-consistent copy-on-write clones of its rootfs and /workspace (its own address and token; the parent's policy unless network flags are given, the parent's idle settings unless idle flags are given)",
        )
        .option('--metadata <key=value>', "the child's label (repeatable)", keyValue, {})
        .option('--timeout <seconds>', "the child's lifetime in seconds (0: none)", wholeNumber, 0)
        .option('--max-freeze-ms <ms>', "longest the parent's filesystems may stay frozen, ms (0: 1500; 100..5000, below 100 counts as 100)", wholeNumber, 0)
        .option('--request-id <id>', 'idempotency key')
        .option('--json', 'print JSON'),
    ),
  ).action(
    action(async (id: string, o: JsonOpts & NetworkFlags & IdleFlags & { metadata: Record<string, string>; timeout: number; maxFreezeMs: number; requestId?: string }, cmd: Command) => {
      const network = networkRequest(o);
      const note = allowOutNote(o);
      if (note && !o.json) process.stderr.write(note);
      // no idle flag: the child takes the parent's idle settings; any idle flag: these settings instead
      const idle = idleRequest(o);
      const needs = flagNeeds(o, true);
      const r = await withServer(dirsOf(cmd), async (api) => {
        await requireServerFeatures(api, needs);
        return api.sandboxes.forkSandbox({ parentId: id, metadata: o.metadata, timeoutSeconds: o.timeout, maxFreezeMs: o.maxFreezeMs, requestId: requestIdOr(o.requestId), network, idle });
      });
      const s = sandboxJson(r.sandbox!);
      const method = forkMethodName(r.method);
      const out = { ...s, fork: { method, parent_held_ms: r.parentHeldMs, clone_ms: r.cloneMs, fork_ms: r.forkMs }, access_token: r.accessToken };
      print(!!o.json, out, () =>
        [
          `${oneLine(s)} forked from ${s.forked_from} (${method}: parent held ${r.parentHeldMs} ms, clone ${r.cloneMs} ms, fork ${r.forkMs} ms)`,
          networkLine(s.network),
          tokenText(r.accessToken, false, !!s.network?.public),
        ]
          .filter(Boolean)
          .join('\n'),
      );
    }),
  );

  sandbox
    .command('reset-rootfs <id>')
    .description('give a sandbox a fresh rootfs from its template (generation + 1); /workspace is kept, processes restart')
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, o: JsonOpts, cmd: Command) => {
        const s = sandboxJson((await withServer(dirsOf(cmd), (api) => api.sandboxes.resetRootfs({ sandboxId: id }))).sandbox!);
        print(!!o.json, s, () => `${oneLine(s)} rootfs generation ${s.rootfs_generation}`);
      }),
    );

  sandbox
    .command('delete <id...>')
    .description('delete sandboxes: processes, devices, network and records')
    .option('--if-exists', 'a sandbox that does not exist (NOT_FOUND) is no error: it is reported as absent')
    .option('--json', 'print JSON: {deleted: [ids], absent: [ids]}')
    .action(
      action(async (ids: string[], o: JsonOpts & { ifExists?: boolean }, cmd: Command) => {
        const deleted: string[] = [];
        const absent: string[] = [];
        await withServer(dirsOf(cmd), async (api) => {
          for (const id of ids) {
            try {
              await api.sandboxes.deleteSandbox({ sandboxId: id });
              deleted.push(id);
            } catch (err) {
              if (!(o.ifExists && err instanceof ClientError && err.code === Status.NOT_FOUND)) throw err;
              absent.push(id);
            }
          }
        });
        print(!!o.json, o.ifExists ? { deleted, absent } : { deleted }, () => [...deleted.map((id) => `${id} deleted`), ...absent.map((id) => `${id} did not exist`)].join('\n'));
      }),
    );

  sandbox
    .command('set-timeout')
    .description('set the lifetime of a sandbox from now (the reaper deletes it then)')
    .argument('<id>')
    .argument('<seconds>', 'lifetime from now in seconds (0: none)', wholeNumber)
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, seconds: number, o: JsonOpts, cmd: Command) => {
        const s = sandboxJson((await withServer(dirsOf(cmd), (api) => api.sandboxes.setTimeout({ sandboxId: id, timeoutSeconds: seconds }))).sandbox!);
        print(!!o.json, s, () => `${s.id} expires ${s.expires_at ?? 'never'}`);
      }),
    );

  registerNetworkCommands(sandbox);
  registerIdleCommands(sandbox);
  return sandbox;
}

/** getValueText is one field of `sandbox get` for people: isolation and idle in words (idle was a JSON blob: newcomer), other objects as JSON. */
export function getValueText(k: string, v: unknown, s: SandboxJson): string {
  if (k === 'isolation') return isolationText(s.isolation);
  if (k === 'idle') return s.idle ? idleLine(s.idle).replace(/^idle: /, '') : 'none';
  if (k === 'network' && v === null) return 'none';
  return typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v);
}

/** What `sandbox resume --all-drained` did: the sandboxes resumed and those that failed (id, the error). */
export interface ResumeAllResult {
  resumed: SandboxJson[];
  failed: { id: string; error: string }[];
  /** DRAINED by hibernation (idle): left as they are, they wake on their next use */
  hibernated: string[];
}

/** RESUME_ALL_AT_ONCE: resumes in flight at once (each boots a VM: the node's cores are the bound). */
const RESUME_ALL_AT_ONCE = 4;

/**
 * resumeAllDrained resumes every DRAINED sandbox that a drain left (not the hibernated ones),
 * RESUME_ALL_AT_ONCE at a time; a failed resume is reported, the others go on (newcomer: after a
 * drain of many the operator looped over the ids by hand).
 */
export async function resumeAllDrained(api: Pick<ServerApi, 'sandboxes'>): Promise<ResumeAllResult> {
  const drained = await listAllSandboxes(api as ServerApi, { states: [SandboxState.SANDBOX_STATE_DRAINED] });
  const out: ResumeAllResult = { resumed: [], failed: [], hibernated: [] };
  const todo = drained.filter((x) => {
    if (!x.idle?.hibernated) return true;
    out.hibernated.push(x.sandboxId);
    return false;
  });
  await mapLimit(todo, RESUME_ALL_AT_ONCE, async (sb) => {
    try {
      out.resumed.push(sandboxJson((await api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId })).sandbox!));
    } catch (err) {
      out.failed.push({ id: sb.sandboxId, error: err instanceof ClientError ? `${Status[err.code]}: ${err.details}` : (err as Error).message });
    }
  });
  return out;
}

/** resumeAllText is resumeAllDrained's result for people: a line per sandbox, then the counts. */
export function resumeAllText(r: ResumeAllResult): string {
  const lines = [
    ...r.resumed.map((s) => oneLine(s)),
    ...r.failed.map((f) => `${f.id}: resume failed: ${f.error}`),
    `resumed ${r.resumed.length} of ${r.resumed.length + r.failed.length} drained sandboxes${r.hibernated.length ? `; ${r.hibernated.length} hibernated left as they are (they wake on their next use)` : ''}`,
  ];
  return lines.join('\n');
}
