import { InvalidArgumentError } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { Template } from '@sandnode/shared/proto/server/v1/template';
import { CliError, EXIT_FAILURE, EXIT_USAGE, UsageError, describeError, formatError, jsonText } from './output';

const rpc = '/sandnode.server.v1.SandboxService/GetSandbox';

describe('describeError: a ClientError of each common code', () => {
  it.each([
    ['NOT_FOUND', Status.NOT_FOUND, undefined],
    ['INVALID_ARGUMENT', Status.INVALID_ARGUMENT, undefined],
    ['FAILED_PRECONDITION', Status.FAILED_PRECONDITION, undefined],
    ['ALREADY_EXISTS', Status.ALREADY_EXISTS, undefined],
    ['ABORTED', Status.ABORTED, undefined],
    ['INTERNAL', Status.INTERNAL, undefined],
    ['UNKNOWN', Status.UNKNOWN, undefined],
    ['UNAVAILABLE', Status.UNAVAILABLE, 'is the node up? nothing answers at /run/sandnode/server.sock; run: sandnode up'],
    ['DEADLINE_EXCEEDED', Status.DEADLINE_EXCEEDED, 'the node did not answer in time; see: sandnode status'],
    ['PERMISSION_DENIED', Status.PERMISSION_DENIED, expect.stringContaining('run sandnode as root')],
    ['UNIMPLEMENTED', Status.UNIMPLEMENTED, 'the node runs a build without this call; see: sandnode version'],
    ['RESOURCE_EXHAUSTED', Status.RESOURCE_EXHAUSTED, 'the node is at a limit: delete sandboxes, or retry later'],
  ])('%s -> "CODE: details", exit 1 (status %d, hint: %s)', (name, code, hint) => {
    const r = describeError(new ClientError(rpc, code, 'the details'));
    expect(r).toEqual({ code: name, grpcCode: code, message: `${name}: the details`, ...(hint ? { hint } : {}), exitCode: EXIT_FAILURE });
  });

  it('picks the hint by where the call went: an EACCES on the socket, a TCP address', () => {
    const eacces = describeError(new ClientError(rpc, Status.UNAVAILABLE, 'No connection established. Last error: Error: connect EACCES /r/server.sock.'), { address: 'unix:///r/server.sock' });
    expect(eacces.hint).toMatch(/^the socket \/r\/server\.sock is root's/);
    const tcp = describeError(new ClientError(rpc, Status.UNAVAILABLE, 'No connection established. Last error: Failed to connect'), { address: '10.0.0.1:7070', tls: true });
    expect(tcp.hint).toBe('is the server listening at 10.0.0.1:7070?');
  });

  it('names a status number it does not know instead of printing "undefined"', () => {
    expect(describeError(new ClientError(rpc, 99 as Status, 'x'))).toMatchObject({ code: 'CODE_99', grpcCode: 99, message: 'CODE_99: x', exitCode: EXIT_FAILURE });
  });
});

describe('describeError: errors of the CLI itself', () => {
  it('a UsageError exits 2', () => {
    expect(describeError(new UsageError('give exactly one of --from-build DIR and --standby'))).toEqual({
      code: 'USAGE',
      message: 'give exactly one of --from-build DIR and --standby',
      exitCode: EXIT_USAGE,
    });
  });

  it("a CliError says its own message and keeps its cause's gRPC code", () => {
    const cause = new ClientError(rpc, Status.ALREADY_EXISTS, 'template base exists');
    expect(describeError(new CliError('template base exists (use --replace to rebuild)', { cause }))).toEqual({
      code: 'ALREADY_EXISTS',
      grpcCode: Status.ALREADY_EXISTS,
      message: 'template base exists (use --replace to rebuild)',
      exitCode: EXIT_FAILURE,
    });
    expect(describeError(new CliError('no cause'))).toEqual({ code: 'ERROR', message: 'no cause', exitCode: EXIT_FAILURE });
  });

  it('any other Error, or a thrown non-Error, is a failure with its message', () => {
    expect(describeError(new Error('no active server: start one with `sandnode up`'))).toEqual({ code: 'ERROR', message: 'no active server: start one with `sandnode up`', exitCode: EXIT_FAILURE });
    expect(describeError('a string')).toEqual({ code: 'ERROR', message: 'a string', exitCode: EXIT_FAILURE });
  });

  it("an option parser's InvalidArgumentError thrown inside an action is a usage error too", () => {
    expect(describeError(new InvalidArgumentError('expected a whole number (0, 1, 2, ...)'))).toEqual({ code: 'USAGE', message: 'expected a whole number (0, 1, 2, ...)', exitCode: EXIT_USAGE });
  });
});

describe('formatError', () => {
  const unavailable = describeError(new ClientError(rpc, Status.UNAVAILABLE, 'No connection established. Resolution note: '));

  it('prints "sandnode: CODE: details" and the hint on its own line for people', () => {
    expect(formatError(unavailable, false)).toBe('sandnode: UNAVAILABLE: No connection established.\nsandnode: is the node up? nothing answers at /run/sandnode/server.sock; run: sandnode up\n');
    expect(formatError(describeError(new ClientError(rpc, Status.NOT_FOUND, 'sandbox sb-1 not found')), false)).toBe('sandnode: NOT_FOUND: sandbox sb-1 not found\n');
  });

  it('prints one JSON line with the gRPC code for --json', () => {
    const line = formatError(unavailable, true);
    expect(line.endsWith('\n')).toBe(true);
    expect(line.trimEnd().includes('\n')).toBe(false);
    expect(JSON.parse(line)).toEqual({
      error: {
        code: 'UNAVAILABLE',
        grpcCode: 14,
        message: 'UNAVAILABLE: No connection established.',
        hint: 'is the node up? nothing answers at /run/sandnode/server.sock; run: sandnode up',
        exitCode: 1,
      },
    });
  });
});

describe('jsonText', () => {
  it('leaves out the _unknownFields a decoded message carries, at any depth', () => {
    const t = Template.decode(Template.encode(Template.fromPartial({ name: 'base', poddVersion: '0.3.0', sizeBytes: 10 })).finish());
    const text = jsonText({ templates: [t] });
    expect(text).not.toContain('_unknownFields');
    expect(JSON.parse(text)).toEqual({ templates: [expect.objectContaining({ name: 'base', poddVersion: '0.3.0', sizeBytes: 10 })] });
  });

  it('is indented JSON of everything else', () => {
    expect(jsonText({ a: 1, b: [null, 'x'] })).toBe('{\n  "a": 1,\n  "b": [\n    null,\n    "x"\n  ]\n}');
  });
});
