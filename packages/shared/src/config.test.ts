import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError, envKey, loadConfig, z } from './config';

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
  it('refuses unknown keys and other file versions', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'cfg-'));
    made.push(dir);
    const f1 = path.join(dir, 'a.json');
    writeFileSync(f1, JSON.stringify({ version: 1, stateDri: '/typo' }));
    expect(() => loadConfig(schema, { service: 'x', file: f1, env: {} })).toThrow(/unknown key "stateDri"/);
    const f2 = path.join(dir, 'b.json');
    writeFileSync(f2, JSON.stringify({ version: 2 }));
    expect(() => loadConfig(schema, { service: 'x', file: f2, env: {} })).toThrow(/"version" is 2/);
  });
});

describe('empty env values', () => {
  it('set a string key to ""', () => {
    const s = z.object({ listen: z.string().default('127.0.0.1:7070') });
    expect(loadConfig(s, { service: 'x', env: { SANDNODE_X_LISTEN: '' } }).listen).toBe('');
  });
});
