import { parse as parseYaml, stringify } from 'yaml';
import { formatError, print } from './output';
import { renderText } from './output-format';
import { jsonSafe, terminalSafe, yamlSafe } from './terminal-safe';

/** Every control byte a terminal acts on: C0 but \n and \t, DEL, C1. */
// eslint-disable-next-line no-control-regex
const RAW = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/;
const EVIL = 'a\x1b[2Jb\x9b31mc\x7fd\re\bf\x00g\x85h\x1b]52;c;b3duZWQ=\x07i\n\tj';

describe('terminalSafe / jsonSafe / yamlSafe', () => {
  test('C0 (not \\n, \\t), DEL and C1 become \\xNN; the rest is unchanged', () => {
    expect(terminalSafe(EVIL)).toBe('a\\x1b[2Jb\\x9b31mc\\x7fd\\x0de\\x08f\\x00g\\x85h\\x1b]52;c;b3duZWQ=\\x07i\n\tj');
    expect(terminalSafe('plain ünïcödé 名前 \u00a0')).toBe('plain ünïcödé 名前 \u00a0');
    for (let c = 0; c <= 0xa0; c++) {
      const ch = String.fromCharCode(c);
      expect(RAW.test(terminalSafe(ch))).toBe(false);
    }
  });

  test('JSON: DEL and C1 are written \\u00NN and the document is the same value', () => {
    const text = jsonSafe(JSON.stringify({ name: EVIL }));
    expect(RAW.test(text)).toBe(false);
    expect(text).toContain('\\u009b');
    expect(JSON.parse(text)).toEqual({ name: EVIL });
  });

  test('YAML: what the yaml package leaves raw is escaped and the document is the same value', () => {
    const text = yamlSafe(stringify({ name: EVIL, long: `${'word '.repeat(30)}\x9b` }));
    expect(RAW.test(text)).toBe(false);
    expect(parseYaml(text)).toEqual({ name: EVIL, long: `${'word '.repeat(30)}\x9b` });
  });

  test('the CLI output paths escape: error lines (human and --json), print and every -o format', () => {
    const r = { code: 'NOT_FOUND', grpcCode: 5, message: `NOT_FOUND: no such file ${EVIL}`, hint: EVIL, exitCode: 1 };
    for (const json of [false, true]) expect(RAW.test(formatError(r, json))).toBe(false);
    expect(JSON.parse(formatError(r, true))).toEqual({ error: r });
    const rendering = { json: { name: EVIL }, human: () => `NAME\n${EVIL}` };
    for (const o of [{}, { json: true }, { output: 'json' as const }, { output: 'yaml' as const }, { output: 'wide' as const }]) expect(RAW.test(renderText(o, rendering))).toBe(false);
    const out: string[] = [];
    const spy = jest.spyOn(process.stdout, 'write').mockImplementation((s) => (out.push(String(s)), true));
    try {
      print(false, {}, () => EVIL);
      print(true, { name: EVIL }, () => '');
    } finally {
      spy.mockRestore();
    }
    expect(out.some((s) => RAW.test(s))).toBe(false);
  });
});
