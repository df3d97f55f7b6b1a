/**
 * Integration: the in-process slot path against the kernel (root, real netns, veth, nftables):
 * the netlink codec's messages make the same slot the spawn path makes (checked with `ip -j`,
 * not with our decoder), errors name the step and leave the worker in the host netns, the
 * worker's libnftables applies one change as one transaction, and a kill -9 of a process in
 * the middle of a slot setup (failpoint network.slot.half-made, both paths, fresh and spare)
 * leaves nothing the next manager's adoption does not find and remove. Names come from a
 * testkit test pool (its own /24 and tag); everything made is removed.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger, DEFAULT_ALWAYS_DENIED, ifacePrefix, makeLayout, parseCidrList, slotAddresses, tableName, type NetLayout, type SlotAddresses } from '@sandnode/shared';
import { describeWith, takeTestPool, waitFor, type TestPool } from '@sandnode/testkit';
import { NET_PARTS } from '../__tests__/net-fixture';
import { createSlot, deleteTable, destroySlot, hostLinks, makeSlot, removeSlot } from './net-host';
import { slotSetups } from '../metrics';
import { NetworkManager } from './manager';
import { NetWorker, WorkerCallError, type SlotSetupPath } from './net-worker';
import { SlotStore } from './slot-store';
import { closeCommands } from '../drivers/command-runner';

// the spawn path's commands in this process (the command helper script is a dist file); the worker's entry is dist's too
process.env.SANDNODE_VMM_SUPERVISOR_COMMAND_HELPERS = '0';
const DIST = path.resolve(__dirname, '../../dist');

const ipj = (args: string[], ns?: string): unknown[] => JSON.parse(execFileSync(ns ? 'nsenter' : 'ip', ns ? [`--net=${ns}`, 'ip', '-j', ...args] : ['-j', ...args]).toString() || '[]') as unknown[];

/** slotView is what `ip` says of slot a: host iface (up, addresses), inside (links up, eth0 addresses, default route, IPv6 off). */
function slotView(a: SlotAddresses): unknown {
  const host = ipj(['-4', 'addr', 'show', 'dev', a.hostIfname]) as { flags: string[]; addr_info: { local: string; prefixlen: number }[] }[];
  const inside = ipj(['-4', 'addr'], a.netnsPath) as { ifname: string; flags: string[]; addr_info: { local: string; prefixlen: number }[] }[];
  const routes = ipj(['-4', 'route'], a.netnsPath) as { dst: string; gateway?: string; dev: string }[];
  const v6 = execFileSync('nsenter', [`--net=${a.netnsPath}`, 'cat', '/proc/sys/net/ipv6/conf/all/disable_ipv6', '/proc/sys/net/ipv6/conf/default/disable_ipv6'])
    .toString()
    .split('\n')
    .filter(Boolean);
  return {
    hostUp: host[0]?.flags.includes('UP'),
    hostAddrs: host[0]?.addr_info.map((x) => `${x.local}/${x.prefixlen}`),
    inside: inside.map((l) => ({ ifname: l.ifname, up: l.flags.includes('UP'), addrs: l.addr_info.map((x) => `${x.local}/${x.prefixlen}`) })).sort((x, y) => x.ifname.localeCompare(y.ifname)),
    routes: routes.map((r) => `${r.dst} ${r.gateway ?? ''} ${r.dev}`).sort(),
    v6,
  };
}

/** leftovers: host links of the layout's prefix, slot netns files (not the node's `tag` file), mounts under its netns dir. */
function leftovers(layout: NetLayout): string[] {
  const links = (ipj(['link']) as { ifname: string }[]).map((l) => l.ifname).filter((n) => n.startsWith(ifacePrefix(layout)));
  const files = existsSync(layout.netnsDir)
    ? readdirSync(layout.netnsDir)
        .filter((f) => f !== 'tag')
        .map((f) => `netns/${f}`)
    : [];
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.includes(layout.netnsDir))
    .map((l) => `mount ${l.split(' ')[4]}`);
  return [...links, ...files, ...mounts];
}

describeWith('network worker (integration)', NET_PARTS, () => {
  let pool: TestPool;
  let dir: string;
  let layout: NetLayout;
  const worker = new NetWorker();
  const log = createLogger('net-worker-it', '0', 'silent');

  beforeAll(() => {
    pool = takeTestPool();
    dir = mkdtempSync(path.join(os.tmpdir(), 'net-worker-it-'));
    layout = makeLayout(pool.settings.pool!, pool.settings.tag!, path.join(dir, 'run'));
  });
  afterAll(async () => {
    for (let s = 0; s < 8; s++) await worker.destroySlot(slotAddresses(layout, s)).catch(() => destroySlot(slotAddresses(layout, s)).catch(() => undefined));
    await worker.close();
    await deleteTable(layout);
    closeCommands();
    rmSync(dir, { recursive: true, force: true });
    pool.release();
  });

  test('the worker makes the slot the spawn path makes; its link dump decodes what ip shows; its destroy removes either', async () => {
    const [a, b] = [slotAddresses(layout, 0), slotAddresses(layout, 1)];
    execFileSync('mkdir', ['-p', layout.netnsDir]);
    await worker.createSlot({ netnsPath: a.netnsPath, hostIfname: a.hostIfname, address: a.address, gateway: a.gateway, prefixLen: 30, existing: false });
    await createSlot(b, 'veth');
    const va = slotView(a) as Record<string, unknown>;
    const vb = slotView(b) as Record<string, unknown>;
    expect(va).toEqual({
      hostUp: true,
      hostAddrs: [`${a.gateway}/30`],
      inside: [
        { ifname: 'eth0', up: true, addrs: [`${a.address}/30`] },
        { ifname: 'lo', up: true, addrs: ['127.0.0.1/8'] },
      ],
      routes: [`${a.address.replace(/\d+$/, (o) => String(Number(o) & ~3))}/30  eth0`, `default ${a.gateway} eth0`].sort(),
      v6: ['1', '1'],
    });
    // the same shape as the spawn path's slot (addresses differ by slot only)
    expect({ ...vb, hostAddrs: undefined, inside: undefined, routes: undefined }).toEqual({ ...va, hostAddrs: undefined, inside: undefined, routes: undefined });
    expect(vb.hostAddrs).toEqual([`${b.gateway}/30`]);
    const links = await worker.links(ifacePrefix(layout));
    expect(links.sort((x, y) => x.name.localeCompare(y.name))).toEqual([
      { name: a.hostIfname, up: true, addrs: [`${a.gateway}/30`] },
      { name: b.hostIfname, up: true, addrs: [`${b.gateway}/30`] },
    ]);
    const viaIp = await hostLinks(layout);
    expect(Object.fromEntries([...viaIp].map(([k, v]) => [k, v]))).toEqual(Object.fromEntries(links.map((l) => [l.name, { addrs: l.addrs, up: l.up }])));
    await worker.destroySlot(a);
    await worker.destroySlot(b); // made by the spawn path
    await worker.destroySlot(b); // idempotent
    expect(leftovers(layout)).toEqual([]);
  });

  test('a failed step names itself and its errno; the worker is back in the host netns and goes on', async () => {
    const a = slotAddresses(layout, 2);
    execFileSync('ip', ['link', 'add', a.hostIfname, 'type', 'bridge']); // the host name is taken
    try {
      const err = await worker.createSlot({ netnsPath: a.netnsPath, hostIfname: a.hostIfname, address: a.address, gateway: a.gateway, prefixLen: 30, existing: false }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(WorkerCallError);
      expect((err as WorkerCallError).errno).toBe(17); // EEXIST
      expect((err as WorkerCallError).step).toMatch(/^veth eth0 <-> /);
      // the worker's next call runs in the host netns: it sees the host's dummy iface
      expect((await worker.links(a.hostIfname)).map((l) => l.name)).toEqual([a.hostIfname]);
      // a bad name never reaches the kernel
      await expect(worker.destroySlot({ netnsPath: a.netnsPath, hostIfname: 'a/b' })).rejects.toThrow(/not an interface name/);
    } finally {
      execFileSync('ip', ['link', 'del', a.hostIfname]);
    }
    await worker.destroySlot(a); // the half-made netns of the failed call
    expect(leftovers(layout)).toEqual([]);
  });

  test("libnftables: one buffer is one transaction; a failing change returns nft's error and changes nothing", async () => {
    const t = `inet ${tableName(layout)}`;
    expect(await worker.nft(`table ${t} {\n  chain c {\n    accept\n  }\n}\n`)).toBe('');
    const err = await worker.nft(`flush chain ${t} c\nadd rule ${t} c ip saddr 1.2.3.4 bogus\n`);
    expect(err).toMatch(/syntax error/);
    expect(execFileSync('nft', ['list', 'chain', ...t.split(' '), 'c']).toString()).toContain('accept'); // the flush did not happen
    for (let i = 0; i < 40; i++) expect(await worker.nft(`list set ${t} nope${i}`)).toMatch(/No such file/); // unread buffers once crashed the process
    expect(await worker.nft(`delete table ${t}`)).toBe('');
  });

  test('a worker that dies is broken with its reason; makeSlot then makes the slot by spawning, and counts the path', async () => {
    const w = new NetWorker();
    const a = slotAddresses(layout, 3);
    expect(await makeSlot(a, 'veth', w, log)).toBe('netlink');
    await removeSlot(a, w);
    await (w as unknown as { worker: { terminate(): Promise<number> } }).worker.terminate();
    await waitFor('the worker marked broken', () => w.broken, 5000);
    expect(w.broken).toMatch(/exited/);
    const before = (await slotSetups.get()).values.find((v) => v.labels.path === 'spawn')?.value ?? 0;
    expect(await makeSlot(a, 'veth', w, log)).toBe('spawn');
    expect((await slotSetups.get()).values.find((v) => v.labels.path === 'spawn')?.value).toBe(before + 1);
    expect(slotView(a)).toMatchObject({ hostUp: true, hostAddrs: [`${a.gateway}/30`] });
    await removeSlot(a, w); // the spawn path's destroy
    expect(leftovers(layout)).toEqual([]);
    await w.close();
  });

  test('a spare whose in-use row cannot be written: the acquire fails, the spare keeps no rules and is handed out whole next', async () => {
    const db = new Database(path.join(dir, 'vm-table-put-fails.db'));
    db.pragma('journal_mode = WAL');
    const store = new SlotStore(db);
    const nft = {
      layout,
      dnsPort: pool.settings.dnsPort!,
      egressProxyPort: pool.settings.egressProxyPort!,
      proxiedPorts: [80],
      alwaysDenied: parseCidrList([...DEFAULT_ALWAYS_DENIED, pool.settings.pool!], 'a'),
    };
    const m = new NetworkManager({ layout, store, spareTarget: 1, slotSetup: 'netlink', log, nft });
    const elements = (): string =>
      execFileSync('nft', ['list', 'map', 'inet', tableName(layout), 'slots']).toString() + execFileSync('nft', ['list', 'set', 'inet', tableName(layout), 'proxy_ifaces']).toString();
    const put = store.put.bind(store);
    try {
      await m.start(new Map());
      await m.idle();
      expect(store.list().map((r) => r.state)).toEqual(['spare']);
      const spareIf = slotAddresses(layout, store.list()[0]!.slot).hostIfname;
      const spy = jest.spyOn(store, 'put').mockImplementationOnce(() => {
        throw new Error('SQLITE_FULL: database or disk is full');
      });
      await expect(m.acquire('vm-full', { owner: 'sb-full', slot: -1, egress: { allowOut: ['allowed.test'], denyOut: [], blockAll: false } })).rejects.toThrow(/SQLITE_FULL/);
      spy.mockRestore();
      expect(store.list().map((r) => r.state)).toEqual(['spare']);
      expect(elements()).not.toContain(spareIf);
      const info = await m.acquire('vm-next', { owner: 'sb-next', slot: -1, egress: { allowOut: ['allowed.test'], denyOut: [], blockAll: false } });
      expect(slotAddresses(layout, info.slot).hostIfname).toBe(spareIf);
      expect(elements()).toContain(spareIf);
      await m.release('vm-next', false);
      expect(elements()).not.toContain(spareIf);
    } finally {
      store.put = put;
      await m.close();
      await m.idle().catch(() => undefined);
      for (const r of store.list()) await destroySlot(slotAddresses(layout, r.slot)).catch(() => undefined);
      db.close();
      await deleteTable(layout);
    }
  });

  /** crashMidSetup runs a manager in a child process that SIGKILLs itself at network.slot.half-made. */
  function crashMidSetup(via: SlotSetupPath, kind: 'fresh' | 'spare', db: string): void {
    const script = path.join(dir, `crash-${via}-${kind}.js`);
    writeFileSync(
      script,
      `
const Database = require(${JSON.stringify(require.resolve('better-sqlite3'))});
const sh = require(${JSON.stringify(path.resolve(__dirname, '../../../../packages/shared/dist/index.js'))});
const { NetworkManager } = require(${JSON.stringify(path.join(DIST, 'network/manager.js'))});
const { SlotStore } = require(${JSON.stringify(path.join(DIST, 'network/slot-store.js'))});
const { failpoints } = require(${JSON.stringify(path.join(DIST, 'core/failpoints.js'))});
const cfg = JSON.parse(process.argv[2]);
const db = new Database(cfg.db); db.pragma('journal_mode = WAL'); db.pragma('synchronous = FULL');
const layout = sh.makeLayout(cfg.pool, cfg.tag, cfg.runDir);
failpoints.set('network.slot.half-made');
const m = new NetworkManager({ layout, store: new SlotStore(db), spareTarget: cfg.kind === 'spare' ? 1 : 0, slotSetup: cfg.via, log: sh.createLogger('crash', '0', 'silent'),
  nft: { layout, dnsPort: cfg.dnsPort, egressProxyPort: cfg.proxyPort, proxiedPorts: [80], alwaysDenied: sh.parseCidrList(cfg.denied, 'a') } });
(async () => {
  await m.start(new Map());
  if (cfg.kind === 'fresh') await m.acquire('vm-crash', { owner: 'sb-crash', slot: -1, egress: { allowOut: [], denyOut: [], blockAll: false } });
  await m.idle();
  process.exit(3); // not reached: the failpoint kills the process
})();
`,
    );
    const r = spawnSync(
      process.execPath,
      [
        script,
        JSON.stringify({
          db,
          pool: pool.settings.pool,
          tag: pool.settings.tag,
          runDir: path.join(dir, 'run'),
          kind,
          via,
          dnsPort: pool.settings.dnsPort,
          proxyPort: pool.settings.egressProxyPort,
          denied: [...DEFAULT_ALWAYS_DENIED, pool.settings.pool],
        }),
      ],
      { encoding: 'utf8', timeout: 60_000 },
    );
    expect({ signal: r.signal, stderr: r.stderr }).toEqual({ signal: 'SIGKILL', stderr: '' });
  }

  test.each([
    ['netlink', 'fresh'],
    ['netlink', 'spare'],
    ['spawn', 'fresh'],
    ['spawn', 'spare'],
  ] as const)('kill -9 in the middle of a %s %s slot setup: the next manager finds and removes what it left', async (via, kind) => {
    const dbFile = path.join(dir, `vm-table-${via}-${kind}.db`);
    crashMidSetup(via, kind, dbFile);
    // the setup was cut in half: its netns is bound, its host side not done
    const left = leftovers(layout);
    expect(left).toEqual(expect.arrayContaining(['netns/0', expect.stringMatching(/^mount /)]));
    if (via === 'netlink') expect(left).toContain(slotAddresses(layout, 0).hostIfname); // the veth, without its address
    const db = new Database(dbFile);
    db.pragma('journal_mode = WAL');
    const store = new SlotStore(db);
    expect(store.list().map((r) => r.state)).toEqual(kind === 'fresh' ? ['in-use'] : []); // fresh: claimed before the host work
    const m = new NetworkManager({
      layout,
      store,
      spareTarget: 0,
      slotSetup: via,
      log,
      nft: {
        layout,
        dnsPort: pool.settings.dnsPort!,
        egressProxyPort: pool.settings.egressProxyPort!,
        proxiedPorts: [80],
        alwaysDenied: parseCidrList([...DEFAULT_ALWAYS_DENIED, pool.settings.pool!], 'a'),
      },
    });
    try {
      await m.start(new Map());
      expect(m.status()).toMatchObject({ enabled: true });
      expect(leftovers(layout)).toEqual([]);
      expect(store.list()).toEqual([]);
      // and the slot is whole when made again
      const info = await m.acquire('vm-after', { owner: 'sb-after', slot: -1, egress: { allowOut: [], denyOut: [], blockAll: false } });
      expect(info.slot).toBe(0);
      expect(slotView(slotAddresses(layout, 0))).toMatchObject({ hostUp: true, hostAddrs: [`${info.gateway}/30`] });
      await m.release('vm-after', false);
      expect(leftovers(layout)).toEqual([]);
    } finally {
      await m.close();
      db.close();
      await deleteTable(layout);
    }
  });
});
