import { Status } from 'nice-grpc-common';
import { hintFor } from './hints';

const SOCK = { address: 'unix:///run/sandnode/server.sock' };
const TCP = { address: '127.0.0.1:7070' };

describe('hintFor: UNAVAILABLE', () => {
  it('the node socket refuses connect (EACCES/EPERM): the socket is root’s, not "is the node up?"', () => {
    const h = hintFor(Status.UNAVAILABLE, 'No connection established. Last error: Error: connect EACCES /run/sandnode/server.sock.', SOCK);
    expect(h).toContain('/run/sandnode/server.sock is root');
    expect(h).toContain('run sandnode as root');
    expect(h).toContain('SANDNODE_SERVER_SOCKET_GROUP');
    expect(h).not.toContain('is the node up');
    expect(hintFor(Status.UNAVAILABLE, 'connect EPERM /x.sock', { address: 'unix:///x.sock', socketGroup: 'sandnode' })).toBe(
      'the socket /x.sock is for root and group sandnode: run sandnode as root, or join group sandnode',
    );
  });

  it('the node socket is missing: is the node up?', () => {
    expect(hintFor(Status.UNAVAILABLE, 'No connection established. Last error: Error: connect ENOENT /run/sandnode/server.sock.', SOCK)).toBe(
      'is the node up? nothing answers at /run/sandnode/server.sock; run: sandnode up',
    );
  });

  it('a server certificate that does not name the host dialled: say so and how to add the name, not "give --tls-ca" (newcomer)', () => {
    const details =
      "No connection established. Last error: Error [ERR_TLS_CERT_ALTNAME_INVALID]: Hostname/IP does not match certificate's altnames: IP: 192.0.2.2 is not in the cert's list: 127.0.0.1.";
    expect(hintFor(Status.UNAVAILABLE, details, { address: '192.0.2.2:7071', tls: true })).toBe(
      "the server's certificate does not name 192.0.2.2 (it names 127.0.0.1): dial one of those, or make the server pair naming it: sandnode certs init --force --san IP:192.0.2.2 (then restart the server with it)",
    );
    const dns =
      "No connection established. Last error: Error [ERR_TLS_CERT_ALTNAME_INVALID]: Hostname/IP does not match certificate's altnames: Host: node1.example. is not in the cert's altnames: DNS:localhost, IP Address:127.0.0.1";
    expect(hintFor(Status.UNAVAILABLE, dns, { address: 'node1.example:7071', tls: true })).toMatch(
      /does not name node1\.example \(it names DNS:localhost, IP Address:127\.0\.0\.1\).*--san DNS:node1\.example/,
    );
  });

  it('the default run dir is relative: the hint names the socket tried and says so (newcomer: `up` from another directory started a second node)', () => {
    const h = hintFor(Status.UNAVAILABLE, 'No connection established. Last error: Error: connect ENOENT /tmp/.sandnode/run/server.sock.', { address: 'unix:///tmp/.sandnode/run/server.sock' });
    expect(h).toMatch(/^is the node up\? nothing answers at \/tmp\/\.sandnode\/run\/server\.sock; run: sandnode up \(the default --run-dir \.\/\.sandnode\/run is relative to this directory/);
  });

  it('the server answered that the sandbox\'s podd did not: the node is up (attacker: a sandbox that replaced its podd got "is the node up?")', () => {
    for (const [code, details] of [
      [Status.UNAVAILABLE, "the sandbox's podd did not answer exec: Connection attempt timed out after 20000ms"],
      [Status.UNAVAILABLE, "the sandbox's podd did not answer exec: Protocol error"],
      [Status.UNAVAILABLE, "the sandbox's podd did not answer exec: Connection dropped"],
      [Status.DEADLINE_EXCEEDED, "the sandbox's podd did not answer readFile: Deadline exceeded"],
    ] as const) {
      const h = hintFor(code, details, SOCK);
      expect(h).toMatch(/^the node is up; the sandbox's agent \(podd\) did not answer/);
      expect(h).toContain('sandnode sandbox reset-rootfs ID');
    }
  });

  it('the node socket took the connection and closed it unserved (its per-user limit of silent connections): the node is up, not "is the node up?"', () => {
    // what grpc-js says when the server accepts and closes at once (measured: a net server destroying each connection)
    const h = hintFor(Status.UNAVAILABLE, 'No connection established. Last error: Failed to connect (2026-12-03T13:37:44.989Z). Resolution note: ', SOCK);
    expect(h).toContain('the node is up');
    expect(h).toContain('256');
    expect(h).not.toContain('is the node up');
    expect(hintFor(Status.UNAVAILABLE, 'read ECONNRESET', SOCK)).toContain('closed it unserved');
    // a TCP address keeps its own hints
    expect(hintFor(Status.UNAVAILABLE, 'No connection established. Last error: Failed to connect (x)', TCP)).toContain('is the server listening');
  });

  it('a TCP address never asks "is the node up?"; a TLS failure names the --tls-* options', () => {
    const cert = hintFor(
      Status.UNAVAILABLE,
      'No connection established. Last error: Error: 40C8:error:0A00045C:SSL routines:ssl3_read_bytes:tlsv13 alert certificate required:../deps/openssl/openssl/ssl/record/rec_layer_s3.c:916:SSL alert number 116',
      { ...TCP, tls: true },
    );
    expect(cert).toMatch(/^TLS with 127\.0\.0\.1:7070 failed: give --tls-ca .*--tls-cert\/--tls-key/);
    expect(hintFor(Status.UNAVAILABLE, 'Failed to connect', { ...TCP, tls: true })).toBe('is the server listening at 127.0.0.1:7070?');
    const plain = hintFor(Status.UNAVAILABLE, 'Failed to connect', TCP);
    expect(plain).toMatch(/^is the server listening at 127\.0\.0\.1:7070\? if it serves TLS, give --tls-ca/);
    for (const h of [cert, plain]) expect(h).not.toContain('sandnode up');
  });
});

describe('hintFor: PERMISSION_DENIED', () => {
  it('a read token: its role, and how to make an admin token (not "sockets belong to root")', () => {
    const h = hintFor(
      Status.PERMISSION_DENIED,
      '/sandnode.server.v1.SandboxService/CreateSandbox: token "ro" has the read role and may not call a method that changes anything; nothing was done',
      TCP,
    );
    expect(h).toBe("the token's role does not allow this call: use an admin token (on the node: sandnode token create --name N --role admin)");
  });

  it('a unix caller outside the socket group: names the group', () => {
    const d = '/x/Y: uid 1000 (gid 1000, pid 5) may not call this socket (allowed: root and members of group sandnode); nothing was done';
    expect(hintFor(Status.PERMISSION_DENIED, d, SOCK)).toBe('only root and members of group sandnode may use this socket: run sandnode as root, or join group sandnode');
  });

  it('a unix caller on a root-only socket: root, or the socketGroup setting', () => {
    const h = hintFor(Status.PERMISSION_DENIED, '/x/Y: uid 1000 (gid 1000, pid 5) may not call this socket (allowed: root only); nothing was done', SOCK);
    expect(h).toMatch(/is root's .*run sandnode as root.*socketGroup/);
  });

  it('another refusal at a TCP address: no socket hint', () => {
    expect(hintFor(Status.PERMISSION_DENIED, 'something else', TCP)).toBeUndefined();
  });
});

describe('hintFor: the other codes', () => {
  it('keeps the hints that depend on the code only', () => {
    expect(hintFor(Status.DEADLINE_EXCEEDED, 'x', SOCK)).toBe('the node did not answer in time; see: sandnode status');
    expect(hintFor(Status.NOT_FOUND, 'x', SOCK)).toBeUndefined();
  });
});

describe('hintFor: FAILED_PRECONDITION', () => {
  it('a fork that missed its freeze window: names the --max-freeze-ms flag, not the proto field', () => {
    expect(hintFor(Status.ABORTED, "the clone did not finish within the parent's 1500 ms freeze window; retry with a larger max_freeze_ms (at most 10000)", TCP)).toBe(
      'retry with a longer freeze window: sandnode sandbox fork ID --max-freeze-ms N (ms, at most 10000), or pause the sandbox and fork it paused',
    );
  });

  it('a pause of a PAUSED or DRAINED sandbox: says so instead of asking to resume it', () => {
    expect(hintFor(Status.FAILED_PRECONDITION, 'sandbox sb-9f is PAUSED; PauseSandbox needs RUNNING', TCP)).toBe('it is paused already; it stays paused (sandnode sandbox get sb-9f)');
    expect(hintFor(Status.FAILED_PRECONDITION, 'sandbox sb-9f is DRAINED; PauseSandbox needs RUNNING', TCP)).toBe('it is drained: it runs nothing to pause');
  });

  it('a DRAINED or PAUSED sandbox (no auto-resume): names the resume command with its id', () => {
    expect(hintFor(Status.FAILED_PRECONDITION, 'sandbox sb-0123abcd is DRAINED; Exec needs RUNNING', SOCK)).toBe('resume it first: sandnode sandbox resume sb-0123abcd');
    expect(hintFor(Status.FAILED_PRECONDITION, 'sandbox sb-9f is PAUSED and its idle.auto_resume is off: ResumeSandbox it first (Exec needs RUNNING)', TCP)).toBe(
      'resume it first: sandnode sandbox resume sb-9f',
    );
  });

  it('other preconditions get no resume hint', () => {
    expect(hintFor(Status.FAILED_PRECONDITION, 'template base is used by sandbox sb-1', SOCK)).toBeUndefined();
    expect(hintFor(Status.FAILED_PRECONDITION, 'sandbox sb-1 is CREATING; Exec needs RUNNING', SOCK)).toBeUndefined();
  });
  it('a token given and refused (unknown, revoked, expired) gets its own hint, not the one for no token', () => {
    const tcp = { address: '127.0.0.1:7070' };
    expect(hintFor(Status.UNAUTHENTICATED, 'the bearer token is not known to this node; nothing was done', tcp)).toMatch(/^the token given is not one this node accepts/);
    expect(hintFor(Status.UNAUTHENTICATED, 'token ci (tk-1) was revoked; nothing was done', tcp)).toMatch(/^the token given/);
    expect(hintFor(Status.UNAUTHENTICATED, 'no bearer token', tcp)).toMatch(/^give a token/);
  });
});

describe('hintFor: UNAUTHENTICATED', () => {
  it('names the safe forms of a token first (env, file), not --token, whose secret every local user can read', () => {
    const h = hintFor(Status.UNAUTHENTICATED, 'no credentials', TCP)!;
    expect(h).toMatch(/^give a token \(env SANDNODE_TOKEN or --token-file FILE;/);
    expect(h).not.toContain('--token,');
  });
});
