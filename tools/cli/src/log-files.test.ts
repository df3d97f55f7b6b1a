import { spawn } from 'node:child_process';
import { appendFileSync, closeSync, mkdtempSync, openSync, mkdirSync, rmSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { LineSplitter, daemonLogFile, lastLines, lineTime, openLog, parseSince, readAllLines, readNew, safeForTerminal, sinceFilter } from './log-files';

describe('log files', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'cli-logs-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('--since: durations and ISO times; anything else is a usage error', () => {
    const now = 1_000_000_000;
    expect(parseSince('90s', now)).toBe(now - 90_000);
    expect(parseSince('10m', now)).toBe(now - 600_000);
    expect(parseSince('2h', now)).toBe(now - 7_200_000);
    expect(parseSince('1d', now)).toBe(now - 86_400_000);
    expect(parseSince('500ms', now)).toBe(now - 500);
    expect(parseSince('2026-12-02T04:00:00Z')).toBe(Date.parse('2026-12-02T04:00:00Z'));
    for (const bad of ['', '10', 'ten minutes', '-5m', '2026-13-45']) expect(() => parseSince(bad, now)).toThrow(/expected a duration/);
  });

  test('a line without a time goes with the line before it', () => {
    const keep = sinceFilter(Date.parse('2026-01-01T00:00:10Z'));
    const lines = ['{"time":"2026-01-01T00:00:05.000Z","msg":"old"}', 'Error: old stack', '{"time":"2026-01-01T00:00:10.000Z","msg":"new"}', '    at new stack'];
    expect(lines.filter(keep)).toEqual(lines.slice(2));
    expect(lineTime('{"time":1500}')).toBe(1500);
    expect(lineTime('not json')).toBeUndefined();
    expect(lines.filter(sinceFilter(undefined))).toEqual(lines);
  });

  test('control characters a sandbox wrote are escaped; newline and tab stay', () => {
    expect(safeForTerminal('a\x1b]0;owned\x07b\r\n\tc\x9bd')).toBe('a\\x1b]0;owned\\x07b\\x0d\n\tc\\x9bd');
  });

  test('follows a file as it grows, whole lines only, and from the start after a trim', () => {
    const f = path.join(dir, 'grow.log');
    writeFileSync(f, 'one\ntw');
    const log = openLog(f)!;
    const split = new LineSplitter();
    expect(split.push(readNew(log))).toEqual(['one']);
    appendFileSync(f, 'o\nthree\n');
    expect(split.push(readNew(log))).toEqual(['two', 'three']);
    expect(readNew(log)).toBe('');
    truncateSync(f, 0);
    appendFileSync(f, 'after trim\n');
    expect(split.push(readNew(log))).toEqual(['after trim']);
    log.pos = 0;
    expect(lastLines(readAllLines(log), 1)).toEqual(['after trim']);
  });

  test('a symlink or a dir is refused, a missing file is undefined', () => {
    const target = path.join(dir, 'secret');
    writeFileSync(target, 'secret\n');
    symlinkSync(target, path.join(dir, 'link.log'));
    expect(() => openLog(path.join(dir, 'link.log'))).toThrow(/is a symlink: not read/);
    mkdirSync(path.join(dir, 'd.log'));
    expect(() => openLog(path.join(dir, 'd.log'))).toThrow(/not a regular file/);
    expect(openLog(path.join(dir, 'none.log'))).toBeUndefined();
  });

  test("a daemon's log file is the file its stderr is; /dev/null or a gone process is none", async () => {
    const f = path.join(dir, 'daemon.log');
    const fd = openSync(f, 'a');
    const toFile = spawn('sleep', ['30'], { stdio: ['ignore', 'ignore', fd] });
    const toNull = spawn('sleep', ['30'], { stdio: 'ignore' });
    closeSync(fd);
    try {
      expect(daemonLogFile(toFile.pid!)).toBe(f);
      expect(daemonLogFile(toNull.pid!)).toBeUndefined();
    } finally {
      toFile.kill();
      toNull.kill();
    }
    await new Promise((r) => toFile.once('exit', r));
    expect(daemonLogFile(toFile.pid!)).toBeUndefined();
  });
});
