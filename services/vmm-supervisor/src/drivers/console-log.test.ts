import { closeSync, openSync, statSync, writeFileSync, writeSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { useTempDir, waitFor } from '@sandnode/testkit';
import { consoleTail, ConsoleWatch, trimConsole } from './console-log';

const CAP = 64 * 1024;

describe('console log', () => {
  const tmp = useTempDir('console-log');

  test('trimConsole leaves a file up to 3/4 of the cap alone and cuts a longer one to its latest half', () => {
    const f = path.join(tmp(), 'console.log');
    writeFileSync(f, 'a'.repeat((CAP * 3) / 4));
    expect(trimConsole(f, CAP)).toBe(0);
    const tail = 'z'.repeat(CAP / 2 - 4) + 'END\n';
    writeFileSync(f, 'x'.repeat(CAP) + tail);
    expect(trimConsole(f, CAP)).toBe(CAP);
    expect(readFileSync(f, 'utf8')).toBe(tail);
    expect(trimConsole(path.join(tmp(), 'missing'), CAP)).toBe(0);
  });

  test('a writer that seeked far (a sparse file of 1 TiB) is cut too; appends after the cut land after the tail', () => {
    const f = path.join(tmp(), 'console.log');
    const fd = openSync(f, 'w');
    writeSync(fd, 'far\n', 2 ** 40);
    closeSync(fd);
    expect(trimConsole(f, CAP)).toBeGreaterThan(0);
    expect(statSync(f).size).toBe(CAP / 2);
    const app = openSync(f, 'a');
    writeSync(app, 'next\n');
    closeSync(app);
    expect(consoleTail(f, 2)).toBe('far | next');
  });

  test('consoleTail quotes the last lines from the last 64 KiB only', () => {
    const f = path.join(tmp(), 'console.log');
    writeFileSync(f, `${'old line\n'.repeat(100_000)}one\ntwo\nthree\n`);
    expect(consoleTail(f, 2)).toBe('two | three');
    expect(consoleTail(path.join(tmp(), 'none'), 2)).toBe('(no console.log)');
  });

  test('ConsoleWatch keeps a file that is written on under its cap, keeping the latest output', async () => {
    const f = path.join(tmp(), 'console.log');
    writeFileSync(f, '');
    const w = new ConsoleWatch(f, CAP, createLogger('test', '0', 'silent'));
    try {
      const fd = openSync(f, 'a');
      for (let i = 0; i < 64; i++) writeSync(fd, `${String(i).padStart(4, '0')}${'.'.repeat(4091)}\n`);
      writeSync(fd, 'LAST\n');
      closeSync(fd);
      await waitFor('the watch to cut the file', () => statSync(f).size <= (CAP * 3) / 4);
      expect(readFileSync(f, 'utf8').endsWith('LAST\n')).toBe(true);
      expect(w.dropped).toBeGreaterThan(0);
    } finally {
      w.close();
    }
  });
});
