/**
 * Wire fuzz (issue 11 section 3) on a real node: seeded random bytes and mutated valid messages
 * (testkit wire-fuzz: bit flips, truncation, wrong wire types, huge lengths, unknown fields,
 * out-of-range enums, 2^64 and negative integers, invalid UTF-8, huge repeated fields, deep
 * nesting) to every RPC of every service in the descriptor set, as raw bytes on the real
 * processes' unix sockets: the server (SandboxService, TemplateService, VersionService, its
 * AdminService), vmm-supervisor (VmService, a VM's FreezePortService), ublk-manager
 * (DeviceService) and podd (PoddService) of a running sandbox. Each call gets a clear code
 * (never UNKNOWN/INTERNAL, a stack trace, or a hang), no process dies, and the node's state
 * (records, templates, VMs, devices, containers, loop devices, lease, epoch fences, daemon
 * pids) is the same after each service's batch as before.
 *
 * Reproduce a failure: SANDNODE_WIRE_FUZZ_SEED=<seed printed> (and SANDNODE_WIRE_FUZZ_CASES).
 *
 * Also the forged-epoch finding: FenceEpoch(2^53-1) and a mutating call carrying that epoch are
 * refused by the real vmm-supervisor and ublk-manager, and the real server keeps working.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, readEpochFile, sandboxDir, socketPath, unixAddress } from '@sandnode/shared';
import { PoddServiceDefinition } from '@sandnode/shared/proto/podd/v1/podd';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { TemplateServiceDefinition } from '@sandnode/shared/proto/server/v1/template';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { FreezePortServiceDefinition, VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { findActiveServer, sandnodeProcesses } from '@sandnode/node-stack';
import {
  badAnswer,
  describeNode,
  execCollect,
  expectCode,
  holderStatus,
  inventory,
  loadRpcs,
  MUTATIONS,
  mutate,
  rawClient,
  seededRandom,
  seedMessage,
  sendRaw,
  startNode,
  type FuzzRpc,
  type MutationKind,
  type Rng,
  type TestNode,
} from '@sandnode/testkit';

jest.setTimeout(900_000);

const SEED = Number(process.env.SANDNODE_WIRE_FUZZ_SEED ?? 20261201);
/** Cases per service (spread over its RPCs round-robin). */
const CASES = Number(process.env.SANDNODE_WIRE_FUZZ_CASES ?? 300);
/** A call with no answer after this long hung (ms). */
const DEADLINE_MS = 20_000;
const HUGE_EPOCH = Number.MAX_SAFE_INTEGER;

/**
 * RPCs whose well-formed default request is a legitimate node-wide operation (drain the node,
 * freeze the sandbox's filesystems, build a template): only payloads that the generated decoder
 * (what the daemon runs) refuses are sent to them, so that the fuzz never asks for what a
 * caller may ask for. (A length-delimited length of 2^63 is read as 0 by the reader, so even a
 * "huge length" can decode: each payload is checked.)
 */
const ONLY_UNDECODABLE: Record<string, (b: Uint8Array) => unknown> = {
  '/sandnode.server.v1.AdminService/Drain': (b) => AdminServiceDefinition.methods.drain.requestType.decode(b),
  '/sandnode.server.v1.AdminService/DrainStream': (b) => AdminServiceDefinition.methods.drainStream.requestType.decode(b),
  '/sandnode.podd.v1.PoddService/Quiesce': (b) => PoddServiceDefinition.methods.quiesce.requestType.decode(b),
  '/sandnode.vmm.v1.FreezePortService/FreezeFilesystems': (b) => FreezePortServiceDefinition.methods.freezeFilesystems.requestType.decode(b),
  '/sandnode.server.v1.TemplateService/BuildTemplate': (b) => TemplateServiceDefinition.methods.buildTemplate.requestType.decode(b),
};
const decodes = (decode: (b: Uint8Array) => unknown, b: Uint8Array) => {
  try {
    decode(b);
    return true;
  } catch {
    return false;
  }
};
/** Services whose mutating calls are epoch-fenced: cases carry the current epoch most of the time, so the handlers run. */
const FENCED = new Set(['sandnode.vmm.v1.VmService', 'sandnode.ublk.v1.DeviceService']);

describeNode('wire fuzz: every RPC of every service on real processes', () => {
  let node: TestNode;
  let sandboxId: string;
  let endpoints: Record<string, string>;
  const rpcs = loadRpcs();
  const services = [...new Set(rpcs.map((r) => r.service))];

  beforeAll(async () => {
    node = await startNode();
    sandboxId = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    const admin = (await findActiveServer(node.dirs.runDir))!.admin;
    const freeze = path.join(node.dirs.runDir, 'vms', sandboxId, 'freeze-port', 'freeze.sock');
    expect(existsSync(freeze)).toBe(true);
    const server = unixAddress(socketPath(node.dirs.runDir, 'server'));
    endpoints = {
      'sandnode.server.v1.SandboxService': server,
      'sandnode.server.v1.TemplateService': server,
      'sandnode.common.v1.VersionService': server,
      'sandnode.server.v1.AdminService': admin,
      'sandnode.vmm.v1.VmService': unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')),
      'sandnode.vmm.v1.FreezePortService': unixAddress(freeze),
      'sandnode.ublk.v1.DeviceService': unixAddress(socketPath(node.dirs.runDir, 'ublk-manager')),
      'sandnode.podd.v1.PoddService': unixAddress(path.join(sandboxDir(node.dirs.runDir, sandboxId), 'podd.sock')),
    };
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** What must not change when calls are refused. */
  const snapshot = async () => {
    const api = node.api;
    const sb = (await api.sandboxes.getSandbox({ sandboxId })).sandbox!;
    const lease = await holderStatus(node.dirs);
    return {
      records: (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => `${s.sandboxId}:${s.state}:${s.pid}:${s.expiresAtMs}:${s.rootfsGeneration}:${JSON.stringify(s.metadata)}`),
      templates: (await api.templates.listTemplates({})).templates.map((t) => t.name),
      inventory: await inventory(node.dirs),
      lease: { epoch: lease?.epoch, role: lease?.role, pid: lease?.holderPid },
      fences: ['vmm-supervisor', 'ublk-manager'].map((c) => readEpochFile(path.join(node.dirs.stateDir, c, 'epoch'))),
      daemons: sandnodeProcesses(node.dirs.runDir)
        .map((p) => p.pid)
        .sort(),
      sandbox: `${sb.state}:${sb.pid}`,
    };
  };

  /** strings of the seed messages by field name: ids nothing has, paths that do not exist, tokens nobody issued. */
  const seedStrings = (rpc: FuzzRpc): Record<string, string> => {
    // reads and Exec/WriteFile of the server reach the real sandbox (deeper paths); everything else names nothing that exists
    const real = rpc.service === 'sandnode.server.v1.SandboxService' && (rpc.idempotency === 'NO_SIDE_EFFECTS' || /\/(Exec|WriteFile)$/.test(rpc.path));
    const none = 'sb-00000000000000f1';
    return {
      sandbox_id: real ? sandboxId : none,
      source_sandbox_id: none,
      parent_id: none,
      cwd: '',
      vm_id: none,
      device_id: 'fuzz-none',
      source_device_id: 'fuzz-none-src',
      template: 'fuzz-none',
      name: 'Fuzz/None',
      from_address: 'unix:///nonexistent/fuzz.sock',
      fd_socket: '',
      template_rootfs: '/nonexistent/rootfs',
      podd_socket_dir: '/nonexistent/podd',
      source_image: '',
      path: 'fuzz.txt',
      k: 'fuzz',
    };
  };

  /** metadataFor: what a case carries; fenced services mostly get the current epoch, sometimes none, a stale, a huge or a garbage one. */
  const metadataFor = (rpc: FuzzRpc, rng: Rng, epoch: number): Record<string, string> => {
    const r = rng.next();
    if (!FENCED.has(rpc.service)) return r < 0.8 ? {} : { 'sandnode-epoch': rng.pick(['0x2', '-1', 'abc', '9'.repeat(30), String(HUGE_EPOCH)]) };
    if (r < 0.55) return { 'sandnode-epoch': String(epoch) };
    if (r < 0.7) return {};
    if (r < 0.8) return { 'sandnode-epoch': String(epoch - 1) };
    if (r < 0.9) return { 'sandnode-epoch': String(HUGE_EPOCH) };
    return { 'sandnode-epoch': rng.pick(['0x2', '-1', '', ' 1', '9'.repeat(30)]) };
  };

  it('has an endpoint for every service of the descriptor set (a new service must be added here; its RPCs are then fuzzed)', () => {
    expect(services.filter((s) => !endpoints[s])).toEqual([]);
  });

  it.each(services)('%s: every case gets a clear code, no process dies, nothing changes', async (service) => {
    const mine = rpcs.filter((r) => r.service === service);
    expect(mine.length).toBeGreaterThan(0);
    const seed = SEED ^ [...service].reduce((h, c) => (Math.imul(h, 31) + c.charCodeAt(0)) | 0, 0);
    const rng = seededRandom(seed);
    const epoch = (await holderStatus(node.dirs))!.epoch;
    const before = await snapshot();
    let client = rawClient(endpoints[service]!);
    const kinds = Object.keys(MUTATIONS) as MutationKind[];
    const undecodable = kinds.filter((k) => MUTATIONS[k].undecodable);
    const failures: string[] = [];
    const codes: Record<string, Record<string, number>> = {};
    try {
      for (let i = 0; i < CASES; i++) {
        const rpc = mine[i % mine.length]!;
        const valid = seedMessage(rpc.requestType, seedStrings(rpc), rng);
        const only = ONLY_UNDECODABLE[rpc.path];
        // the first round sends each RPC its valid seed as is
        let c = i < mine.length && !only ? { kind: 'seed', bytes: valid } : mutate(rng.pick(only ? undecodable : kinds), rpc.requestType, valid, rng);
        while (only && decodes(only, c.bytes)) c = mutate(rng.pick(undecodable), rpc.requestType, valid, rng);
        const md = metadataFor(rpc, rng, epoch);
        const a = await sendRaw(client, rpc, c.bytes, md, DEADLINE_MS);
        const name = rpc.path.split('/')[2]!;
        for (const key of [name, `kind:${c.kind}`]) {
          const per = (codes[key] ??= {});
          per[String(Status[a.code])] = (per[String(Status[a.code])] ?? 0) + 1;
        }
        const bad = badAnswer(a, DEADLINE_MS, endpoints[service]!.replace(/^unix:\/\//, ''));
        // a connection the client had to reset fails every later call on it: count this one, go on on a new one
        if (bad && /RST_STREAM|session has been destroyed/.test(a.details)) {
          client.close();
          client = rawClient(endpoints[service]!);
        }
        if (bad) failures.push(`case ${i} ${rpc.path} ${c.kind} (${c.bytes.length} bytes: ${c.bytes.subarray(0, 64).toString('hex')}) metadata ${JSON.stringify(md)}: ${bad}`);
      }
    } finally {
      client.close();
    }
    console.log(`wire fuzz ${service} seed ${seed} (SANDNODE_WIRE_FUZZ_SEED=${SEED}), ${CASES} cases: ${JSON.stringify(codes)}`);
    // the endpoint still answers, and nothing changed
    const after = await snapshot();
    expect({ seed: SEED, failures }).toEqual({ seed: SEED, failures: [] });
    expect(after).toEqual(before);
  });

  it('a forged huge epoch is refused by the real vmm-supervisor and ublk-manager (FAILED_PRECONDITION naming both epochs); the real server keeps working', async () => {
    const epoch = (await holderStatus(node.dirs))!.epoch;
    const vch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
    const dch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'ublk-manager')));
    try {
      const before = await snapshot();
      const at = { timeoutMs: 10_000, retryAttempts: 1, epoch: () => HUGE_EPOCH };
      const vms = createServiceClient(VmServiceDefinition, vch, at);
      const devices = createServiceClient(DeviceServiceDefinition, dch, at);
      const refused = new RegExp(`epoch ${HUGE_EPOCH} is above epoch ${epoch}, the highest the node's server lease names`);
      await expectCode(vms.fenceEpoch({ epoch: HUGE_EPOCH }), Status.FAILED_PRECONDITION, refused);
      await expectCode(devices.fenceEpoch({ epoch: HUGE_EPOCH }), Status.FAILED_PRECONDITION, refused);
      await expectCode(vms.deleteVm({ vmId: sandboxId }), Status.FAILED_PRECONDITION, refused);
      await expectCode(devices.deleteDevice({ deviceId: `${sandboxId}-ws` }), Status.FAILED_PRECONDITION, refused);
      expect(await snapshot()).toEqual(before);
      // the real server's epoch still passes: a full lifecycle through it works
      const api = node.api;
      const sb = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
      expect((await execCollect(api, sb.sandboxId, ['echo', 'still-served'])).stdout).toBe('still-served\n');
      await api.sandboxes.pauseSandbox({ sandboxId: sb.sandboxId });
      await api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
      expect((await execCollect(api, sandboxId, ['echo', 'ok'])).stdout).toBe('ok\n');
      expect(['vmm-supervisor', 'ublk-manager'].map((c) => readEpochFile(path.join(node.dirs.stateDir, c, 'epoch')))).toEqual([epoch, epoch]);
    } finally {
      vch.close();
      dch.close();
    }
  });
});
