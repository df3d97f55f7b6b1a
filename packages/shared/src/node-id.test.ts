/**
 * The node's stable id (node-id.ts): made once and kept, the same for components starting
 * together, taken from SANDNODE_NODE_ID when set, and refused (never silently replaced) when
 * the kept file is garbage, a symlink or a directory.
 */
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { NODE_ID_ENV, NODE_ID_FILE, claimNodeId, keptNodeId, nodeIdProblem, resolveNodeId } from './node-id';

describe('resolveNodeId', () => {
  const made: string[] = [];
  const tmp = () => {
    const d = mkdtempSync(path.join(os.tmpdir(), 'node-id-'));
    made.push(d);
    return d;
  };
  afterAll(() => made.forEach((d) => rmSync(d, { recursive: true, force: true })));

  it('makes an id once, keeps it in <stateDir>/node-id and returns the same one on every later start', () => {
    const dir = path.join(tmp(), 'state');
    const first = resolveNodeId(dir, {});
    expect(first).toMatch(/^node-[0-9a-f]{16}$/);
    expect(readFileSync(path.join(dir, NODE_ID_FILE), 'utf8')).toBe(`${first}\n`);
    expect(resolveNodeId(dir, {})).toBe(first);
    expect(readdirSync(dir)).toEqual([NODE_ID_FILE]); // no temp file left
  });

  it('SANDNODE_NODE_ID wins and is kept, so a later start without it keeps that identity', () => {
    const dir = tmp();
    resolveNodeId(dir, {});
    expect(resolveNodeId(dir, { [NODE_ID_ENV]: 'worker-7.example' })).toBe('worker-7.example');
    expect(resolveNodeId(dir, {})).toBe('worker-7.example');
  });

  it('refuses a bad SANDNODE_NODE_ID and changes nothing', () => {
    const dir = tmp();
    const kept = resolveNodeId(dir, {});
    for (const bad of ['Upper', '../x', 'a b', '-lead', 'x'.repeat(254), 'a\nb']) {
      expect(() => resolveNodeId(dir, { [NODE_ID_ENV]: bad })).toThrow(/SANDNODE_NODE_ID=.* is not a node id/);
    }
    expect(resolveNodeId(dir, {})).toBe(kept);
  });

  it('refuses a kept file that is garbage, a symlink or a directory, naming it', () => {
    const dir = tmp();
    writeFileSync(path.join(dir, NODE_ID_FILE), '\u0000\u0001garbage');
    expect(() => resolveNodeId(dir, {})).toThrow(/node-id does not hold a node id/);
    const d2 = path.join(dir, 'b');
    mkdirSync(d2);
    writeFileSync(path.join(dir, 'elsewhere'), 'node-0123456789abcdef\n');
    symlinkSync(path.join(dir, 'elsewhere'), path.join(d2, NODE_ID_FILE));
    expect(() => resolveNodeId(d2, {})).toThrow(/is a symlink/);
    const d3 = path.join(dir, 'c');
    mkdirSync(path.join(d3, NODE_ID_FILE), { recursive: true });
    expect(() => resolveNodeId(d3, {})).toThrow(/not a regular file/);
  });

  it('keptNodeId reads the kept id and makes nothing: undefined when there is none, or garbage, or a symlink', () => {
    const dir = tmp();
    expect(keptNodeId(dir)).toBeUndefined();
    expect(readdirSync(dir)).toEqual([]);
    const id = resolveNodeId(dir, {});
    expect(keptNodeId(dir)).toBe(id);
    writeFileSync(path.join(dir, NODE_ID_FILE), 'Not An Id');
    expect(keptNodeId(dir)).toBeUndefined();
    const d2 = tmp();
    writeFileSync(path.join(d2, 'elsewhere'), 'node-0123456789abcdef\n');
    symlinkSync(path.join(d2, 'elsewhere'), path.join(d2, NODE_ID_FILE));
    expect(keptNodeId(d2)).toBeUndefined();
  });

  it("a component that lost the race (the file appeared after its read) takes the winner's id, never writes over it", () => {
    const dir = tmp();
    const file = path.join(dir, NODE_ID_FILE);
    expect(claimNodeId(file, 'node-aaaaaaaaaaaaaaaa')).toBe('node-aaaaaaaaaaaaaaaa');
    expect(claimNodeId(file, 'node-bbbbbbbbbbbbbbbb')).toBe('node-aaaaaaaaaaaaaaaa');
    expect(readFileSync(file, 'utf8')).toBe('node-aaaaaaaaaaaaaaaa\n');
    expect(readdirSync(dir)).toEqual([NODE_ID_FILE]);
  });

  it('says why a string is not a node id', () => {
    expect(nodeIdProblem('ip-10-0-0-1.ec2.internal')).toBeUndefined();
    expect(nodeIdProblem('')).toMatch(/empty/);
    expect(nodeIdProblem('A')).toMatch(/only a-z/);
  });
});
