import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError, configSlotPath, envKey, loadConfig, pickConfigSlot, writeConfigSlots, z, type ConfigNote } from './config';

const schema = z.object({
  stateDir: z.string().default('/var/lib/x'),
  maxDevices: z.coerce.number().int().min(1).default(8),
});

const made: string[] = [];
afterAll(() => made.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('loadConfig', () => {
  it('names env keys after the service and key', () => {
    expect(envKey('vmm-supervisor', 'stateDir')).toBe('SANDNODE_VMM_SUPERVISOR_STATE_DIR');
  });
  it('takes defaults, then the file, then env, then overrides', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const file = path.join(dir, 'c.json');
    writeFileSync(file, JSON.stringify({ version: 1, stateDir: '/from/file', maxDevices: 3 }));
    expect(loadConfig(schema, { service: 'x', env: {} })).toEqual({ stateDir: '/var/lib/x', maxDevices: 8 });
    expect(loadConfig(schema, { service: 'x', file, env: {} })).toEqual({ stateDir: '/from/file', maxDevices: 3 });
    expect(loadConfig(schema, { service: 'x', file, env: { SANDNODE_X_MAX_DEVICES: '5' } })).toEqual({ stateDir: '/from/file', maxDevices: 5 });
    expect(loadConfig(schema, { service: 'x', file, env: { SANDNODE_X_MAX_DEVICES: '5' }, overrides: { maxDevices: 6 } }).maxDevices).toBe(6);
  });
  it('names the bad key and its env var', () => {
    expect(() => loadConfig(schema, { service: 'x', env: { SANDNODE_X_MAX_DEVICES: 'zero' } })).toThrow(ConfigError);
    expect(() => loadConfig(schema, { service: 'x', env: { SANDNODE_X_MAX_DEVICES: '0' } })).toThrow(/key "maxDevices" \(env SANDNODE_X_MAX_DEVICES\)/);
  });
  it('ignores and notes unknown keys (any format), refuses newer formats and bad versions', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const f1 = path.join(dir, 'a.json');
    writeFileSync(f1, JSON.stringify({ version: 1, stateDri: '/typo', maxDevices: 4 }));
    const notes: ConfigNote[] = [];
    expect(loadConfig(schema, { service: 'x', file: f1, env: {}, notes })).toEqual({ stateDir: '/var/lib/x', maxDevices: 4 });
    expect(notes).toEqual([expect.objectContaining({ file: f1, kind: 'unknown', keys: ['stateDri'] })]);
    expect(notes[0]?.message).toMatch(/ignoring keys this build of x does not know: stateDri/);
    const f3 = path.join(dir, 'b.json');
    writeFileSync(f3, JSON.stringify({ version: 3 }));
    expect(() => loadConfig(schema, { service: 'x', file: f3, env: {} })).toThrow(/"version" is 3, this build reads config formats 1..2: give it the slot of a format it reads \(b\.v2\.json/);
    for (const bad of [0, 1.5, '2', null]) {
      writeFileSync(f3, JSON.stringify({ version: bad }));
      expect(() => loadConfig(schema, { service: 'x', file: f3, env: {} })).toThrow(ConfigError);
    }
  });
  it('reads a format-1 file without version, as 0.2.0 wrote them', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const f = path.join(dir, 'old.json');
    writeFileSync(f, JSON.stringify({ stateDir: '/old' }));
    const notes: ConfigNote[] = [];
    expect(loadConfig(schema, { service: 'x', file: f, env: {}, notes }).stateDir).toBe('/old');
    expect(notes).toEqual([]);
  });
  it('refuses to start when a key listed in required is unknown, naming every one', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const f = path.join(dir, 'c.json');
    writeFileSync(f, JSON.stringify({ version: 2, required: ['maxDevices', 'newA', 'newB'], maxDevices: 2, newA: 1, newB: true, newC: 'x' }));
    expect(() => loadConfig(schema, { service: 'x', file: f, env: {} })).toThrow(/"required" lists keys this build of x does not know: newA, newB \(/);
    // the same file without them in required starts, the keys noted once
    writeFileSync(f, JSON.stringify({ version: 2, required: ['maxDevices'], maxDevices: 2, newA: 1, newB: true }));
    const notes: ConfigNote[] = [];
    expect(loadConfig(schema, { service: 'x', file: f, env: {}, notes }).maxDevices).toBe(2);
    expect(notes.map((n) => n.keys)).toEqual([['newA', 'newB']]);
    for (const bad of ['maxDevices', [1], ['has space'], {}]) {
      writeFileSync(f, JSON.stringify({ version: 2, required: bad }));
      expect(() => loadConfig(schema, { service: 'x', file: f, env: {} })).toThrow(/key "required" must be a list of key names/);
    }
  });
  it('notes retired keys apart from unknown ones and never refuses them', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const f = path.join(dir, 'd.json');
    writeFileSync(f, JSON.stringify({ version: 1, oldKey: '/x', other: 1 }));
    const notes: ConfigNote[] = [];
    loadConfig(schema, { service: 'x', file: f, env: {}, notes, retired: { oldKey: 'gone in 0.3.0' } });
    expect(notes.map((n) => [n.kind, n.keys])).toEqual([
      ['unknown', ['other']],
      ['retired', ['oldKey']],
    ]);
    expect(notes[1]?.message).toMatch(/no longer uses: oldKey \(gone in 0\.3\.0\)/);
  });
});

describe('config slots', () => {
  it('names the slots beside the file', () => {
    expect(configSlotPath('/etc/s/server.json', 1)).toBe('/etc/s/server.json');
    expect(configSlotPath('/etc/s/server.json', 2)).toBe('/etc/s/server.v2.json');
    expect(configSlotPath('/etc/s/server.conf', 2)).toBe('/etc/s/server.conf.v2');
  });
  it('writes a v2 slot with every key and a v1 slot with the v1 keys; each reader takes the newest it reads', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const file = path.join(dir, 'svc.json');
    writeFileSync(path.join(dir, 'svc.v3.json'), JSON.stringify({ version: 3, stale: true }));
    const written = writeConfigSlots(file, { values: { stateDir: '/s', maxDevices: 7, newKey: 'n' }, v1Keys: ['stateDir'] });
    expect(written).toEqual([path.join(dir, 'svc.v2.json'), file]);
    expect(existsSync(path.join(dir, 'svc.v3.json'))).toBe(false); // a newer build's slot is stale now
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual({ version: 1, stateDir: '/s' });
    expect(JSON.parse(readFileSync(path.join(dir, 'svc.v2.json'), 'utf8'))).toEqual({ version: 2, stateDir: '/s', maxDevices: 7, newKey: 'n' });
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(pickConfigSlot(file)).toBe(path.join(dir, 'svc.v2.json'));
    expect(pickConfigSlot(file, 1)).toBe(file);
    // this build reads the v2 slot through the v1 name, noting the key it does not know
    const notes: ConfigNote[] = [];
    expect(loadConfig(schema, { service: 'x', file, env: {}, notes })).toEqual({ stateDir: '/s', maxDevices: 7 });
    expect(notes.map((n) => [n.file, n.keys])).toEqual([[path.join(dir, 'svc.v2.json'), ['newKey']]]);
    // a strict format-1 reader (0.2.0's rule: every key known) accepts the v1 slot
    const strictV1 = z.strictObject({ version: z.literal(1), stateDir: z.string() });
    expect(strictV1.safeParse(JSON.parse(readFileSync(file, 'utf8'))).success).toBe(true);
  });
  it('puts required keys into both slots, so that a format-1 reader refuses naming them', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const file = path.join(dir, 'svc.json');
    writeConfigSlots(file, { values: { stateDir: '/s', mustHave: 1 }, v1Keys: ['stateDir'], required: ['mustHave'] });
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual({ version: 1, stateDir: '/s', mustHave: 1 });
    expect(JSON.parse(readFileSync(path.join(dir, 'svc.v2.json'), 'utf8'))).toEqual({ version: 2, required: ['mustHave'], stateDir: '/s', mustHave: 1 });
    expect(() => loadConfig(schema, { service: 'x', file, env: {} })).toThrow(/does not know: mustHave/);
    expect(() => writeConfigSlots(file, { values: {}, v1Keys: [], required: ['absent'] })).toThrow(/required key "absent" has no value/);
  });
  it('falls back to the v1 file when no v2 slot exists, and fails naming a missing file', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    expect(() => loadConfig(schema, { service: 'x', file: path.join(dir, 'none.json'), env: {} })).toThrow(/config file .*none\.json: ENOENT/);
  });
});

describe('empty env values', () => {
  it('set a string key to ""', () => {
    const s = z.object({ listen: z.string().default('127.0.0.1:7070') });
    expect(loadConfig(s, { service: 'x', env: { SANDNODE_X_LISTEN: '' } }).listen).toBe('');
  });
});
