import { colorOn, paint, Progress } from './terminal';

/** A stream that records what is written. */
function sink(isTTY: boolean): { isTTY: boolean; text: string; write(s: string): boolean } {
  return {
    isTTY,
    text: '',
    write(s: string) {
      this.text += s;
      return true;
    },
  };
}

describe('colour and progress', () => {
  test('colour only on a TTY and never with NO_COLOR (even empty)', () => {
    expect(colorOn(sink(true), {})).toBe(true);
    expect(colorOn(sink(false), {})).toBe(false);
    expect(colorOn(sink(true), { NO_COLOR: '' })).toBe(false);
    expect(colorOn(sink(true), { NO_COLOR: '1' })).toBe(false);
    expect(paint('green', 'up', sink(false), {})).toBe('up');
    expect(paint('green', 'up', sink(true), { NO_COLOR: '1' })).toBe('up');
    expect(paint('green', 'up', sink(true), {})).toBe('\x1b[32mup\x1b[39m');
  });

  test('progress writes nothing when piped or quiet, and a line with steps on a TTY', () => {
    for (const [tty, quiet] of [
      [false, false],
      [true, true],
    ] as const) {
      const s = sink(tty);
      const p = new Progress('building', quiet, s);
      p.step('done 1');
      p.set('more');
      p.stop();
      expect(s.text).toBe('');
    }
    const s = sink(true);
    const p = new Progress('building', false, s);
    p.step('step one done');
    p.stop();
    expect(s.text).toContain('building (');
    expect(s.text).toContain('step one done\n');
    expect(s.text.endsWith('\r\x1b[2K')).toBe(true);
  });
});
