#!/usr/bin/env node
/**
 * sandnode: the operator CLI of a node. Tables for people, `--json` for scripts.
 *
 *   sandnode up | down [--purge] | status [--json] | version [--json]
 *   sandnode template build [NAME] [--replace] | template list [--json]
 *   sandnode sandbox create --template base [--json] | list | get ID | exec ID -- CMD... |
 *                    pause ID | resume ID | delete ID | set-timeout ID SECONDS
 *   sandnode demo
 *
 * Exit codes: 0 ok; 1 failure (the gRPC status is printed); `sandbox exec` exits with the
 * command's exit code.
 */
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { Command, InvalidArgumentError as UsageError, Option } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, SUITE_VERSION, buildCommit, runtimeName, socketPath, unixAddress } from '@sandnode/shared';
import { ForkMethod, SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { connectServer, sandboxJson, table, type SandboxJson } from './api';
import { COMPONENTS, findRunning, getVersion, purgeNode, startComponent, stopComponent, type StackDirs } from './stack';
import { runDemo } from './demo';
import { versionRow, versionTable, type VersionRow } from './version';
import { upgradeServer, upgradeServerViaStandby } from './upgrade';
import { upgradeUblkManager } from './upgrade-ublk';
import { FlockLease } from '../store/flock-lease';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { AdminServiceDefinition, DrainOutcome, ServerRole } from '@sandnode/shared/proto/server/v1/admin';

interface GlobalOpts {
  stateDir: string;
  runDir: string;
  listen: string;
  address?: string;
}

const program = new Command('sandnode')
  .description('Operate a sandnode node: its daemons, templates and sandboxes')
  .addOption(new Option('--state-dir <dir>', 'state dir (records, images, templates)').env('SANDNODE_STATE_DIR').default(DEFAULT_STATE_DIR))
  .addOption(new Option('--run-dir <dir>', 'runtime dir (sockets, sandbox dirs)').env('SANDNODE_RUN_DIR').default(DEFAULT_RUN_DIR))
  .addOption(new Option('--listen <host:port>', 'server TCP listen address for `up` ("" disables)').env('SANDNODE_LISTEN').default('127.0.0.1:7070'))
  .addOption(new Option('--address <addr>', 'server address (default: its unix socket in the runtime dir)').env('SANDNODE_ADDRESS'));

function dirs(): StackDirs & { address: string } {
  const o = program.opts<GlobalOpts>();
  return {
    stateDir: path.resolve(o.stateDir),
    runDir: path.resolve(o.runDir),
    listen: o.listen,
    address: o.address ?? unixAddress(socketPath(o.runDir, 'server')),
  };
}

function print(json: boolean, value: unknown, human: () => string): void {
  process.stdout.write(json ? `${JSON.stringify(value, null, 2)}\n` : `${human()}\n`);
}

/** action wraps a command: gRPC errors print as "CODE: message" and exit 1. */
function action<A extends unknown[]>(fn: (...args: A) => Promise<void>): (...args: A) => Promise<void> {
  return async (...args: A) => {
    try {
      await fn(...args);
    } catch (err) {
      if (err instanceof ClientError) {
        process.stderr.write(`sandnode: ${Status[err.code]}: ${err.details}\n`);
        if (err.code === Status.UNAVAILABLE) process.stderr.write('sandnode: is the node up? run: sandnode up\n');
      } else {
        process.stderr.write(`sandnode: ${(err as Error).message}\n`);
      }
      process.exit(1);
    }
  };
}

program
  .command('up')
  .description('start vmm-supervisor, ublk-manager and server in the background; returns when all answer (idempotent)')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { json?: boolean }) => {
      const d = dirs();
      const out: { name: string; pid: number; started: boolean; ms: number }[] = [];
      for (const c of COMPONENTS) {
        const t0 = Date.now();
        const r = await startComponent(d, c);
        out.push({ name: c, pid: r.pid, started: r.started, ms: Date.now() - t0 });
      }
      print(!!o.json, { components: out }, () =>
        table(['COMPONENT', 'PID', 'ACTION', 'MS'], out.map((c) => [c.name, c.pid, c.started ? 'started' : 'already running', c.ms])),
      );
    }),
  );

program
  .command('down')
  .description('stop the daemons; sandboxes keep running (--purge: delete every sandbox, device, mount and dir)')
  .option('--purge', 'remove everything: sandboxes, devices, mounts, dirs')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { purge?: boolean; json?: boolean }) => {
      const d = dirs();
      const deleted: string[] = [];
      if (o.purge && findRunning(d, 'server')) {
        const api = connectServer(d.address);
        try {
          const list = await api.sandboxes.listSandboxes({ pageSize: 1000 });
          await Promise.all(
            list.sandboxes.map(async (s) => {
              await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
              deleted.push(s.sandboxId);
            }),
          );
        } finally {
          api.close();
        }
      }
      const stopped: string[] = [];
      for (const c of [...COMPONENTS].reverse()) if (await stopComponent(d, c)) stopped.push(c);
      const purge = o.purge ? await purgeNode(d) : undefined;
      print(!!o.json, { stopped, deleted, purge }, () =>
        [
          `stopped: ${stopped.join(', ') || 'nothing was running'}`,
          ...(o.purge
            ? [
                `deleted sandboxes: ${deleted.length}`,
                `removed containers: ${purge?.containers.length ?? 0}, mounts: ${purge?.mounts.length ?? 0}, loop devices: ${purge?.loopDevices.length ?? 0}, dirs: ${purge?.dirs.join(' ') || 'none'}`,
              ]
            : ['sandboxes keep running; `sandnode up` adopts them']),
        ].join('\n'),
      );
    }),
  );

program
  .command('status')
  .description('show the components (version, pid, features) and the number of sandboxes')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { json?: boolean }) => {
      const d = dirs();
      const components: { name: string; version: string | null; pid: number | null; features: string[]; up: boolean }[] = [];
      for (const c of COMPONENTS) {
        const v = await getVersion(d, c);
        components.push({ name: c, version: v?.version ?? null, pid: v?.pid ?? findRunning(d, c)?.pid ?? null, features: v?.features ?? [], up: !!v });
      }
      let sandboxes: number | null = null;
      if (components.find((c) => c.name === 'server')?.up) {
        sandboxes = 0;
        const api = connectServer(d.address);
        try {
          let token = '';
          do {
            const page = await api.sandboxes.listSandboxes({ pageSize: 1000, pageToken: token });
            sandboxes += page.sandboxes.length;
            token = page.nextPageToken;
          } while (token);
        } finally {
          api.close();
        }
      }
      const holder = FlockLease.readHolder(path.join(d.stateDir, 'server.lease'));
      let lease: { epoch: number; role: string } | undefined;
      if (holder && FlockLease.isHeld(path.join(d.stateDir, 'server.lease'))) {
        const ch = createSandnodeChannel(holder.admin);
        try {
          const st = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 2000, retryAttempts: 1 }).getLeaseStatus({});
          lease = { epoch: Number(st.epoch), role: ServerRole[st.role].replace('SERVER_ROLE_', '') };
        } catch {
          /* the holder does not answer */
        } finally {
          ch.close();
        }
      }
      const server = holder && lease ? { slot: holder.slot, pid: holder.pid, version: holder.version } : null;
      const epoch = lease?.epoch ?? null;
      print(!!o.json, { components, sandboxes, epoch, server }, () =>
        [
          table(
            ['COMPONENT', 'STATUS', 'VERSION', 'PID', 'FEATURES'],
            components.map((c) => [c.name, c.up ? 'up' : 'down', c.version ?? '-', c.pid ?? '-', c.features.join(',')]),
          ),
          `sandboxes: ${sandboxes ?? 'unknown (the server is down; sandboxes keep running)'}`,
          `epoch: ${epoch ?? '-'}; active server: ${server ? `${server.slot ? `slot ${server.slot}, ` : ''}pid ${server.pid}, version ${server.version}` : 'none'}`,
        ].join('\n'),
      );
    }),
  );

/** addVersionCommand adds `version [--json]`: the CLI's and each daemon's version, commit and runtime. */
function addVersionCommand(parent: Command): void {
  parent
    .command('version')
    .description("print the CLI's and each running daemon's version, commit and runtime (Node version)")
    .option('--json', 'print JSON')
    .action(
      action(async (o: { json?: boolean }) => {
        const d = dirs();
        const cli: VersionRow = { name: 'cli', up: true, version: SUITE_VERSION, commit: buildCommit(), runtime: runtimeName(), pid: process.pid };
        const components: VersionRow[] = [];
        for (const c of COMPONENTS) components.push(versionRow(c, await getVersion(d, c)));
        print(!!o.json, { cli, components }, () => versionTable([cli, ...components]));
      }),
    );
}
addVersionCommand(program);

const template = program.command('template').description('build and list templates');
template
  .command('build [name]')
  .description('build a template from busybox-static, the Node runtime and podd (no network)')
  .option('--replace', 'rebuild an existing template (refused while a sandbox uses it)')
  .option('--json', 'print JSON')
  .action(
    action(async (name: string | undefined, o: { replace?: boolean; json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const r = await api.templates.buildTemplate({ name: name ?? 'base', replace: !!o.replace });
        const t = r.template!;
        print(!!o.json, t, () => `built template ${t.name} (podd ${t.poddVersion}, ${(t.sizeBytes / 1048576).toFixed(1)} MiB) in ${t.buildMs} ms at ${t.rootfsPath}`);
      } catch (err) {
        if (err instanceof ClientError && err.code === Status.ALREADY_EXISTS && !o.replace) {
          process.stderr.write(`sandnode: template ${name ?? 'base'} exists (use --replace to rebuild)\n`);
          process.exit(1);
        }
        throw err;
      } finally {
        api.close();
      }
    }),
  );
template
  .command('list')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const r = await api.templates.listTemplates({});
        print(!!o.json, r.templates, () =>
          table(['NAME', 'PODD', 'SIZE MIB', 'CREATED'], r.templates.map((t) => [t.name, t.poddVersion, (t.sizeBytes / 1048576).toFixed(1), new Date(t.createdAtMs).toISOString()])),
        );
      } finally {
        api.close();
      }
    }),
  );

const sandbox = program.command('sandbox').description('create, inspect, run commands in, pause, resume and delete sandboxes');

/** forkMethodName is the CLI's word for how a fork held its parent. */
function forkMethodName(m: ForkMethod): string {
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

/** wholeNumber parses a numeric option; anything but 0, 1, 2, ... is a usage error naming the option. */
function wholeNumber(v: string): number {
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) throw new UsageError('expected a whole number (0, 1, 2, ...)');
  return Number(v);
}

function kv(v: string, acc: Record<string, string>): Record<string, string> {
  const i = v.indexOf('=');
  if (i <= 0) throw new Error(`--metadata ${v}: expected KEY=VALUE`);
  acc[v.slice(0, i)] = v.slice(i + 1);
  return acc;
}

sandbox
  .command('create')
  .requiredOption('--template <name>', 'template name', 'base')
  .option('--timeout <seconds>', 'lifetime in seconds (0: none)', wholeNumber, 0)
  .option('--metadata <key=value>', 'label (repeatable)', kv, {})
  .option('--vcpus <n>', 'virtual CPUs', wholeNumber, 0)
  .option('--memory-mib <n>', 'memory limit in MiB', wholeNumber, 0)
  .option('--disk-bytes <n>', '/workspace size in bytes', wholeNumber, 0)
  .option('--request-id <id>', 'idempotency key')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { template: string; timeout: number; metadata: Record<string, string>; vcpus: number; memoryMib: number; diskBytes: number; requestId?: string; json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const r = await api.sandboxes.createSandbox({
          template: o.template,
          timeoutSeconds: o.timeout,
          metadata: o.metadata,
          resources: { vcpus: o.vcpus, memoryMib: o.memoryMib, diskBytes: o.diskBytes },
          // always an idempotency key, so the client's retry on UNAVAILABLE cannot create twice
          requestId: o.requestId ?? `cli-${randomBytes(8).toString('hex')}`,
        });
        const s = sandboxJson(r.sandbox!);
        print(!!o.json, s, () => `${s.id} ${s.state} pid ${s.pid}`);
      } finally {
        api.close();
      }
    }),
  );

sandbox
  .command('list')
  .option('--state <state>', 'only this state (RUNNING, PAUSED, ...)')
  .option('--metadata <key=value>', 'only with this label (repeatable)', kv, {})
  .option('--json', 'print JSON')
  .action(
    action(async (o: { state?: string; metadata: Record<string, string>; json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const states = o.state ? [SandboxState[`SANDBOX_STATE_${o.state.toUpperCase()}` as keyof typeof SandboxState]] : [];
        if (states.some((s) => s === undefined)) throw new Error(`--state ${o.state}: unknown state`);
        const all: SandboxJson[] = [];
        let token = '';
        do {
          const page = await api.sandboxes.listSandboxes({ states: states as SandboxState[], metadata: o.metadata, pageSize: 1000, pageToken: token });
          all.push(...page.sandboxes.map(sandboxJson));
          token = page.nextPageToken;
        } while (token);
        print(!!o.json, all, () => table(['ID', 'STATE', 'PID', 'TEMPLATE', 'CREATED'], all.map((s) => [s.id, s.state, s.pid, s.template, s.created_at])));
      } finally {
        api.close();
      }
    }),
  );

sandbox
  .command('get <id>')
  .option('--json', 'print JSON')
  .action(
    action(async (id: string, o: { json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const s = sandboxJson((await api.sandboxes.getSandbox({ sandboxId: id })).sandbox!);
        print(!!o.json, s, () => Object.entries(s).map(([k, v]) => `${k.padEnd(13)} ${typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)}`).join('\n'));
      } finally {
        api.close();
      }
    }),
  );

for (const [name, verb] of [
  ['pause', 'pauseSandbox'],
  ['resume', 'resumeSandbox'],
] as const) {
  sandbox
    .command(`${name} <id>`)
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, o: { json?: boolean }) => {
        const api = connectServer(dirs().address);
        try {
          const s = sandboxJson((await api.sandboxes[verb]({ sandboxId: id })).sandbox!);
          print(!!o.json, s, () => `${s.id} ${s.state} pid ${s.pid}`);
        } finally {
          api.close();
        }
      }),
    );
}

sandbox
  .command('fork <id>')
  .description('fork a RUNNING or PAUSED sandbox: a new sandbox from crash-consistent copy-on-write clones of its rootfs and /workspace')
  .option('--metadata <key=value>', "the child's label (repeatable)", kv, {})
  .option('--timeout <seconds>', "the child's lifetime in seconds (0: none)", wholeNumber, 0)
  .option('--max-freeze-ms <ms>', "longest the parent's filesystems may stay frozen, ms (0: 1500; 100..5000, below 100 counts as 100)", wholeNumber, 0)
  .option('--request-id <id>', 'idempotency key')
  .option('--json', 'print JSON')
  .action(
    action(async (id: string, o: { metadata: Record<string, string>; timeout: number; maxFreezeMs: number; requestId?: string; json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const r = await api.sandboxes.forkSandbox({
          parentId: id,
          metadata: o.metadata,
          timeoutSeconds: o.timeout,
          maxFreezeMs: o.maxFreezeMs,
          // always an idempotency key, so the client's retry on UNAVAILABLE cannot fork twice
          requestId: o.requestId ?? `cli-${randomBytes(8).toString('hex')}`,
        });
        const s = sandboxJson(r.sandbox!);
        const method = forkMethodName(r.method);
        const out = { ...s, fork: { method, parent_held_ms: r.parentHeldMs, clone_ms: r.cloneMs, fork_ms: r.forkMs } };
        print(!!o.json, out, () => `${s.id} ${s.state} pid ${s.pid} forked from ${s.forked_from} (${method}: parent held ${r.parentHeldMs} ms, clone ${r.cloneMs} ms, fork ${r.forkMs} ms)`);
      } finally {
        api.close();
      }
    }),
  );

sandbox
  .command('reset-rootfs <id>')
  .description('give a sandbox a fresh rootfs from its template (generation + 1); /workspace is kept, processes restart')
  .option('--json', 'print JSON')
  .action(
    action(async (id: string, o: { json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const s = sandboxJson((await api.sandboxes.resetRootfs({ sandboxId: id })).sandbox!);
        print(!!o.json, s, () => `${s.id} ${s.state} pid ${s.pid} rootfs generation ${s.rootfs_generation}`);
      } finally {
        api.close();
      }
    }),
  );

sandbox
  .command('delete <id...>')
  .option('--json', 'print JSON')
  .action(
    action(async (ids: string[], o: { json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        for (const id of ids) await api.sandboxes.deleteSandbox({ sandboxId: id });
        print(!!o.json, { deleted: ids }, () => ids.map((id) => `${id} deleted`).join('\n'));
      } finally {
        api.close();
      }
    }),
  );

sandbox
  .command('set-timeout <id> <seconds>')
  .option('--json', 'print JSON')
  .action(
    action(async (id: string, seconds: string, o: { json?: boolean }) => {
      const api = connectServer(dirs().address);
      try {
        const s = sandboxJson((await api.sandboxes.setTimeout({ sandboxId: id, timeoutSeconds: wholeNumber(seconds) })).sandbox!);
        print(!!o.json, s, () => `${s.id} expires ${s.expires_at ?? 'never'}`);
      } finally {
        api.close();
      }
    }),
  );

sandbox
  .command('exec <id> <cmd...>')
  .description('run a command in the sandbox, stream its output and exit with its exit code (use -- before the command)')
  .option('--cwd <dir>', 'working directory inside the sandbox', '')
  .option('--env <key=value>', 'environment variable (repeatable)', kv, {})
  .option('--timeout-ms <ms>', 'kill the command after this many ms', wholeNumber, 0)
  .option('--stdin', 'pass this process standard input to the command')
  .action(
    action(async (id: string, cmd: string[], o: { cwd: string; env: Record<string, string>; timeoutMs: number; stdin?: boolean }) => {
      const api = connectServer(dirs().address);
      let code = 1;
      try {
        let stdin = Buffer.alloc(0);
        if (o.stdin) {
          const chunks: Buffer[] = [];
          for await (const c of process.stdin) chunks.push(c as Buffer);
          stdin = Buffer.concat(chunks);
        }
        for await (const ev of api.sandboxes.exec({ sandboxId: id, argv: cmd, env: o.env, cwd: o.cwd, stdin, timeoutMs: o.timeoutMs })) {
          const e = ev.event;
          if (e?.$case === 'stdout') process.stdout.write(e.value);
          else if (e?.$case === 'stderr') process.stderr.write(e.value);
          else if (e?.$case === 'exit') code = e.value.exitCode;
        }
      } finally {
        api.close();
      }
      process.exitCode = code;
    }),
  );

const upgrade = program.command('upgrade').description('upgrade (or roll back) a component live, by handover');
upgrade
  .command('server')
  .description('hand the node over to a server of another build: one started here from --from-build, or the running standby (--standby)')
  .option('--from-build <dir>', 'a checkout of sandnode with node_modules and a build ("." for this one)')
  .option('--standby', 'use the standby server that already runs (k8s: the standby slot container after its image update)')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { fromBuild?: string; standby?: boolean; json?: boolean }) => {
      if (!!o.fromBuild === !!o.standby) throw new Error('give exactly one of --from-build DIR and --standby');
      const r = o.standby ? await upgradeServerViaStandby(dirs()) : await upgradeServer(dirs(), o.fromBuild as string);
      print(!!o.json, r, () =>
        table(
          ['', 'OLD', 'NEW'],
          [
            ['version', r.oldVersion, r.newVersion],
            ['pid', r.oldPid, r.newPid],
            ['epoch', r.epoch - 1, r.epoch],
          ],
        ) + `
hold window ${r.holdWindowMs} ms, ${r.adopted} sandboxes adopted in ${r.adoptionMs} ms, listeners ${r.listeners.join(' ')}`,
      );
    }),
  );

upgrade
  .command('ublk-manager')
  .description('move every device to ublk-manager in the other slot (device handover): one started here from --from-build, or the one that runs (--standby)')
  .option('--from-build <dir>', 'a checkout of sandnode with node_modules and a build ("." for this one)')
  .option('--standby', 'use the other slot\'s ublk-manager that already runs (k8s: the standby slot container)')
  .option('--json', 'print JSON')
  .action(
    action(async (o: { fromBuild?: string; standby?: boolean; json?: boolean }) => {
      if (!!o.fromBuild === !!o.standby) throw new Error('give exactly one of --from-build DIR and --standby');
      const r = await upgradeUblkManager(dirs(), o.standby ? undefined : o.fromBuild);
      print(!!o.json, r, () =>
        table(
          ['', 'OLD', 'NEW'],
          [
            ['slot', r.oldSlot, r.newSlot],
            ['version', r.oldVersion, r.newVersion],
            ['pid', r.oldPid, r.newPid],
          ],
        ) + `\n${r.devices.length} devices moved (${r.mode}); stall p50 ${r.stallP50Ms.toFixed(2)} ms, p99 ${r.stallP99Ms.toFixed(2)} ms; total ${r.totalMs} ms`,
      );
    }),
  );

program
  .command('drain')
  .description('pause and persist every live sandbox (bounded concurrency), then stop the device manager; for pod deletion / node shutdown')
  .option('--deadline-ms <ms>', 'time for the whole drain', wholeNumber, 20000)
  .option('--concurrency <n>', 'sandboxes drained at once', wholeNumber, 8)
  .option('--json', 'print JSON')
  .action(
    action(async (o: { deadlineMs: number; concurrency: number; json?: boolean }) => {
      const d = dirs();
      const holder = FlockLease.readHolder(path.join(d.stateDir, 'server.lease'));
      if (!holder) throw new Error('no active server');
      const ch = createSandnodeChannel(holder.admin);
      try {
        const admin = createServiceClient(AdminServiceDefinition, ch, { timeoutMs: o.deadlineMs + 10_000 });
        const r = await admin.drain({ deadlineMs: o.deadlineMs, concurrency: o.concurrency });
        const rows = r.sandboxes.map((s) => ({ id: s.sandboxId, outcome: DrainOutcome[s.outcome].replace('DRAIN_OUTCOME_', ''), resume: s.resumeMethod, ms: s.ms, error: s.error }));
        print(!!o.json, { sandboxes: rows, durationMs: r.durationMs, deviceManagerStopped: r.deviceManagerStopped }, () =>
          `${table(['ID', 'OUTCOME', 'RESUME', 'MS', 'ERROR'], rows.map((x) => [x.id, x.outcome, x.resume, x.ms, x.error]))}
drained in ${r.durationMs} ms; device manager stopped: ${r.deviceManagerStopped}`,
        );
        if (rows.some((x) => x.outcome !== 'PRESERVED')) process.exitCode = 1;
      } finally {
        ch.close();
      }
    }),
  );

program
  .command('demo')
  .description('the main job: a full tour on a fresh node (needs root): 3 sandboxes, files, streams, pause/resume, server kill -9 + adoption, cleanup')
  .option('--keep', 'leave the stack running afterwards')
  .action(
    action(async (o: { keep?: boolean }) => {
      const ok = await runDemo(dirs(), { keep: !!o.keep });
      process.exitCode = ok ? 0 : 1;
    }),
  );


program.parseAsync(process.argv).catch((err: unknown) => {
  process.stderr.write(`sandnode: ${(err as Error).message}\n`);
  process.exit(1);
});
