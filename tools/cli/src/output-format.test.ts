import { Command } from 'commander';
import { parse } from 'yaml';
import { ListTemplatesResponse } from '@sandnode/shared/proto/server/v1/template';
import { addOutputOptions, renderText, type OutputOpts } from './output-format';
import { UsageError, wantsJsonErrors } from './output';

const tpl = { name: 'base', poddVersion: '0.3.0', rootfsPath: '/t/base/rootfs', sizeBytes: 5, createdAtMs: 1_700_000_000_000, buildMs: 7 };
const r = {
  json: [tpl],
  proto: () => ListTemplatesResponse.toJSON({ templates: [tpl] }),
  human: () => 'NAME\nbase',
  wide: () => 'NAME  ROOTFS\nbase  /t/base/rootfs',
};

describe('-o json|yaml|wide', () => {
  test('--json keeps the CLI document; -o json is the proto mapping (lowerCamelCase, defaults left out); yaml is the same document', () => {
    expect(JSON.parse(renderText({ json: true }, r))).toEqual([tpl]);
    const proto = JSON.parse(renderText({ output: 'json' }, r)) as { templates: Record<string, unknown>[] };
    expect(JSON.parse(renderText({ output: 'json' }, { ...r, proto: () => ListTemplatesResponse.toJSON({ templates: [{ ...tpl, buildMs: 0 }] }) }))).toEqual({
      templates: [{ ...proto.templates[0], buildMs: undefined }],
    });
    expect(proto).toEqual({ templates: [{ name: 'base', poddVersion: '0.3.0', rootfsPath: '/t/base/rootfs', sizeBytes: 5, createdAtMs: 1_700_000_000_000, buildMs: 7 }] });
    expect(parse(renderText({ output: 'yaml' }, r))).toEqual(proto);
  });

  test('wide has more columns; without -o the table; a command without a wide view shows its table', () => {
    expect(renderText({}, r)).toBe('NAME\nbase\n');
    expect(renderText({ output: 'wide' }, r)).toContain('ROOTFS');
    expect(renderText({ output: 'wide' }, { json: 1, human: () => 'T' })).toBe('T\n');
    expect(renderText({ output: 'json' }, { json: { a: 1 }, human: () => 'T' })).toBe('{\n  "a": 1\n}\n');
  });

  test('--json with -o yaml or wide is a usage error', () => {
    expect(() => renderText({ json: true, output: 'yaml' }, r)).toThrow(UsageError);
    expect(() => renderText({ json: true, output: 'wide' }, r)).toThrow(/either --json or -o wide/);
  });

  test('-o takes only json, yaml, wide; errors are JSON for --json, -o json and -o yaml', () => {
    const cmd = addOutputOptions(new Command('x').exitOverride().configureOutput({ writeErr: () => undefined }));
    expect(() => cmd.parse(['-o', 'xml'], { from: 'user' })).toThrow(/Allowed choices are json, yaml, wide/);
    cmd.parse(['-o', 'yaml'], { from: 'user' });
    expect(cmd.opts<OutputOpts>().output).toBe('yaml');
    expect([{ json: true }, { output: 'json' }, { output: 'yaml' }, { output: 'wide' }, {}].map(wantsJsonErrors)).toEqual([true, true, true, false, false]);
  });
});
