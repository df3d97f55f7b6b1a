import { readFileSync } from 'node:fs';
import { DEFAULT_SECCOMP_PROFILE, loadSeccompProfile } from './seccomp';
import { buildEnv, buildOciSpec, DEFAULT_CAPABILITIES, FREEZE_PORT_MOUNT, HOST_SYSFS_MASKED, SANDBOX_INIT, USERNS_CAPABILITIES } from './oci-spec';

const base = {
  vmId: 'vm-1',
  rootfsPath: '/run/sn/vms/vm-1/rootfs',
  poddGuestDir: '/run/sn/sandboxes/vm-1/guest',
  workspacePath: '/run/sn/vms/vm-1/workspace',
  hostname: '',
  env: {},
  resources: { vcpus: 2, memoryMib: 256, pids: 1024 },
};

describe('buildOciSpec', () => {
  test('a networked VM joins its slot netns and sees resolv.conf and hosts read-only; in a user namespace the host sysfs ro with its net part masked', () => {
    const network = { netnsPath: '/run/sn/netns/3', resolvConf: '/run/sn/vms/vm-1/net/resolv.conf', hosts: '/run/sn/vms/vm-1/net/hosts' };
    const s = buildOciSpec({ ...base, network });
    expect(s.linux.namespaces).toContainEqual({ type: 'network', path: '/run/sn/netns/3' });
    expect(s.linux.namespaces.filter((n) => n.type === 'network')).toHaveLength(1);
    expect(s.mounts).toContainEqual({ destination: '/etc/resolv.conf', type: 'bind', source: network.resolvConf, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] });
    expect(s.mounts).toContainEqual({ destination: '/etc/hosts', type: 'bind', source: network.hosts, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] });
    expect(s.mounts.find((m) => m.destination === '/sys')!.type).toBe('sysfs'); // no user namespace: a sysfs of its own
    const u = buildOciSpec({ ...base, network, userns: { hostId: 100000, size: 65536 } });
    expect(u.mounts.find((m) => m.destination === '/sys')).toEqual({ destination: '/sys', type: 'bind', source: '/sys', options: ['rbind', 'ro', 'nosuid', 'noexec', 'nodev'] });
    expect(u.linux.maskedPaths).toEqual(expect.arrayContaining(HOST_SYSFS_MASKED));
    // without a network: a new loopback-only netns, no resolv.conf bind, a sysfs of its own
    const plain = buildOciSpec({ ...base, userns: { hostId: 100000, size: 65536 } });
    expect(plain.linux.namespaces).toContainEqual({ type: 'network' });
    expect(plain.mounts.map((m) => m.destination)).not.toContain('/etc/resolv.conf');
    expect(plain.mounts.find((m) => m.destination === '/sys')!.type).toBe('sysfs');
  });

  test('runs the sandbox init as root with the base env, in /', () => {
    const s = buildOciSpec(base);
    expect(s.process.args).toEqual([SANDBOX_INIT]);
    expect(s.process.cwd).toBe('/');
    expect(s.process.terminal).toBe(false);
    expect(s.process.env).toEqual(['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin', 'HOME=/root', 'SANDNODE_SANDBOX_ID=vm-1']);
  });

  test('root is the writable overlay; hostname defaults to the vm id', () => {
    const s = buildOciSpec(base);
    expect(s.root).toEqual({ path: base.rootfsPath, readonly: false });
    expect(s.hostname).toBe('vm-1');
    expect(buildOciSpec({ ...base, hostname: 'box' }).hostname).toBe('box');
  });

  test('mounts: the runc defaults, then podd socket dir and workspace binds', () => {
    const s = buildOciSpec(base);
    expect(s.mounts.map((m) => [m.destination, m.type])).toEqual([
      ['/proc', 'proc'],
      ['/dev', 'tmpfs'],
      ['/dev/pts', 'devpts'],
      ['/dev/shm', 'tmpfs'],
      ['/dev/mqueue', 'mqueue'],
      ['/sys', 'sysfs'],
      ['/sys/fs/cgroup', 'cgroup'],
      ['/run/sandnode', 'bind'],
      ['/workspace', 'bind'],
    ]);
    expect(s.mounts.find((m) => m.destination === '/sys')?.options).toContain('ro');
    expect(s.mounts.find((m) => m.destination === '/sys/fs/cgroup')?.options).toContain('ro');
    expect(s.mounts.find((m) => m.destination === '/run/sandnode')).toEqual({
      destination: '/run/sandnode',
      type: 'bind',
      source: base.poddGuestDir,
      options: ['rbind', 'rw', 'nosuid', 'nodev', 'noexec'],
    });
    expect(s.mounts.find((m) => m.destination === '/workspace')?.source).toBe(base.workspacePath);
  });

  test('no workspace drive: no /workspace mount; a read-only workspace binds ro', () => {
    expect(buildOciSpec({ ...base, workspacePath: undefined }).mounts.some((m) => m.destination === '/workspace')).toBe(false);
    const ro = buildOciSpec({ ...base, workspaceReadOnly: true }).mounts.find((m) => m.destination === '/workspace');
    expect(ro?.options).toContain('ro');
    expect(ro?.options).not.toContain('rw');
  });

  test('own pid, ipc, uts, mount, network and cgroup namespaces; runc default caps and masked paths', () => {
    const s = buildOciSpec(base);
    expect(s.linux.namespaces.map((n) => n.type).sort()).toEqual(['cgroup', 'ipc', 'mount', 'network', 'pid', 'uts']);
    expect(s.process.capabilities).toEqual({
      bounding: DEFAULT_CAPABILITIES,
      effective: DEFAULT_CAPABILITIES,
      permitted: DEFAULT_CAPABILITIES,
      ambient: DEFAULT_CAPABILITIES,
    });
    expect(s.linux.maskedPaths).toContain('/proc/kcore');
    expect(s.linux.readonlyPaths).toContain('/proc/sys');
  });

  test('memory limit and cpu quota from resources; cgroupsPath /sandnode/<id>', () => {
    const s = buildOciSpec(base);
    expect(s.linux.resources.memory).toEqual({ limit: 256 * 1024 * 1024 });
    expect(s.linux.resources.cpu).toEqual({ quota: 200_000, period: 100_000 });
    expect(s.linux.cgroupsPath).toBe('/sandnode/vm-1');
  });

  test('noSwap (a cgroup v2 host with swap accounting): memory.swap = memory.limit, which runc writes as memory.swap.max 0; none by default (v1: memsw untouched)', () => {
    expect(buildOciSpec({ ...base, noSwap: true }).linux.resources.memory).toEqual({ limit: 256 * 1024 * 1024, swap: 256 * 1024 * 1024 });
    expect(buildOciSpec({ ...base, noSwap: false }).linux.resources.memory).toEqual({ limit: 256 * 1024 * 1024 });
  });

  test('is plain JSON', () => {
    const s = buildOciSpec(base);
    expect(JSON.parse(JSON.stringify(s))).toEqual(s);
  });
});

describe('freeze port mount', () => {
  test('the freeze-port dir is bound read-only, nosuid, nodev, noexec at /run/sandnode-freeze', () => {
    const s = buildOciSpec({ ...base, freezePortDir: '/run/sn/vms/vm-1/freeze-port' });
    expect(s.mounts.find((m) => m.destination === FREEZE_PORT_MOUNT)).toEqual({
      destination: '/run/sandnode-freeze',
      type: 'bind',
      source: '/run/sn/vms/vm-1/freeze-port',
      options: ['rbind', 'ro', 'nosuid', 'nodev', 'noexec'],
    });
  });
  test('no freeze-port dir, no mount', () => {
    expect(buildOciSpec(base).mounts.find((m) => m.destination === FREEZE_PORT_MOUNT)).toBeUndefined();
  });
});

describe('buildEnv', () => {
  test('spec env is added sorted and may override PATH, never SANDNODE_SANDBOX_ID', () => {
    expect(buildEnv('vm-1', { ZED: '1', PATH: '/x', A: 'b', SANDNODE_SANDBOX_ID: 'evil' })).toEqual(['PATH=/x', 'HOME=/root', 'A=b', 'SANDNODE_SANDBOX_ID=vm-1', 'ZED=1']);
  });
});

describe('podd socket handover', () => {
  test('the guest dir, never the socket dir, is mounted at /run/sandnode', () => {
    const s = buildOciSpec(base);
    const m = s.mounts.filter((x) => x.destination === '/run/sandnode');
    expect(m).toHaveLength(1);
    expect(m[0]?.source).toBe('/run/sn/sandboxes/vm-1/guest');
    expect(s.mounts.some((x) => x.source === '/run/sn/sandboxes/vm-1')).toBe(false);
  });

  test('SANDNODE_PODD_LISTEN_FD names the inherited fd and cannot be overridden by spec env', () => {
    const s = buildOciSpec({ ...base, poddListenFd: 3, env: { SANDNODE_PODD_LISTEN_FD: '7' } });
    expect(s.process.env.filter((e) => e.startsWith('SANDNODE_PODD_LISTEN_FD='))).toEqual(['SANDNODE_PODD_LISTEN_FD=3']);
    expect(buildEnv('vm-1', { SANDNODE_PODD_LISTEN_FD: '7' })).not.toContain('SANDNODE_PODD_LISTEN_FD=7');
  });

  test('pids limit from resources; the seccomp profile is written only when there is one', () => {
    expect(buildOciSpec(base).linux.resources.pids).toEqual({ limit: 1024 });
    expect(buildOciSpec(base).linux.seccomp).toBeUndefined();
    const profile = loadSeccompProfile(DEFAULT_SECCOMP_PROFILE)!;
    expect(buildOciSpec({ ...base, seccomp: profile }).linux.seccomp).toBe(profile);
  });
});

describe('the shipped seccomp profile', () => {
  const profile = loadSeccompProfile(DEFAULT_SECCOMP_PROFILE)!;
  const allowed = new Set(profile.syscalls.filter((r) => r.action === 'SCMP_ACT_ALLOW' && !('args' in r)).flatMap((r) => r.names));
  test('denies by default with EPERM, and names its source', () => {
    expect(profile.defaultAction).toBe('SCMP_ACT_ERRNO');
    expect(profile.defaultErrnoRet).toBe(1);
    expect(profile).not.toHaveProperty('comment');
    expect(JSON.parse(readFileSync(DEFAULT_SECCOMP_PROFILE, 'utf8')).comment.join(' ')).toMatch(/Docker/);
  });
  test.each([
    'add_key',
    'keyctl',
    'request_key',
    'unshare',
    'setns',
    'bpf',
    'perf_event_open',
    'userfaultfd',
    'kexec_load',
    'kexec_file_load',
    'io_uring_setup',
    'io_uring_enter',
    'io_uring_register',
    'mount',
    'umount2',
    'pivot_root',
    'open_tree',
    'move_mount',
    'fsopen',
    'fsconfig',
    'fsmount',
    'fspick',
    'mount_setattr',
    'init_module',
    'finit_module',
    'delete_module',
    'reboot',
    'swapon',
    'clone3',
  ])('%s is not allowed unconditionally', (name) => {
    expect(allowed.has(name)).toBe(false);
  });
  test('what a shell, busybox and Node need is allowed; clone only without namespace flags; clone3 answers ENOSYS', () => {
    for (const n of ['read', 'write', 'openat', 'execve', 'wait4', 'futex', 'epoll_pwait', 'mmap', 'rt_sigaction', 'socket', 'connect', 'accept4', 'prctl', 'getrandom', 'statx'])
      expect(allowed.has(n)).toBe(true);
    const clone = profile.syscalls.find((r) => r.names.includes('clone')) as unknown as { args: { value: number; op: string }[] };
    expect(clone.args[0]).toMatchObject({ op: 'SCMP_CMP_MASKED_EQ', value: 0x7e020000 });
    expect(profile.syscalls.find((r) => r.names.includes('clone3'))).toMatchObject({ action: 'SCMP_ACT_ERRNO', errnoRet: 38 });
  });
  test('a missing or malformed profile is a config error naming the key; "unconfined" is none', () => {
    expect(loadSeccompProfile('unconfined')).toBeUndefined();
    expect(() => loadSeccompProfile('/no/such/profile.json')).toThrow(/key "seccompProfile"/);
    expect(() => loadSeccompProfile(__filename)).toThrow(/key "seccompProfile"/);
  });
});

describe('buildOciSpec with a user namespace', () => {
  const range = { hostId: 100000, size: 65536 };

  test('without a range: no user namespace, no id maps, runc default capabilities (0.2.0 isolation)', () => {
    const s = buildOciSpec(base);
    expect(s.linux.namespaces.map((n) => n.type)).not.toContain('user');
    expect(s.linux.uidMappings).toBeUndefined();
    expect(s.linux.gidMappings).toBeUndefined();
    expect(s.process.capabilities.effective).toEqual(DEFAULT_CAPABILITIES);
  });

  test('with a range: a user namespace mapping 0..size-1 to the range, for uids and gids', () => {
    const s = buildOciSpec({ ...base, userns: range });
    expect(s.linux.namespaces.map((n) => n.type)).toEqual(['pid', 'network', 'ipc', 'uts', 'mount', 'cgroup', 'user']);
    expect(s.linux.uidMappings).toEqual([{ containerID: 0, hostID: 100000, size: 65536 }]);
    expect(s.linux.gidMappings).toEqual([{ containerID: 0, hostID: 100000, size: 65536 }]);
    expect(s.process.user).toEqual({ uid: 0, gid: 0 });
  });

  test('with a range: Docker default capabilities less mknod and net_raw, in every set; no_new_privs stays', () => {
    const s = buildOciSpec({ ...base, userns: range });
    for (const set of ['bounding', 'effective', 'permitted', 'ambient']) expect(s.process.capabilities[set]).toEqual(USERNS_CAPABILITIES);
    expect(USERNS_CAPABILITIES).toEqual(expect.arrayContaining(['CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_FOWNER', 'CAP_SETUID', 'CAP_SETGID']));
    for (const c of ['CAP_SYS_ADMIN', 'CAP_MKNOD', 'CAP_NET_RAW', 'CAP_NET_ADMIN', 'CAP_SYS_PTRACE', 'CAP_SYS_MODULE']) expect(USERNS_CAPABILITIES).not.toContain(c);
    expect(s.process.noNewPrivileges).toBe(true);
  });

  test('blockIO goes into linux.resources as given; none without it', () => {
    expect(buildOciSpec(base).linux.resources.blockIO).toBeUndefined();
    expect('blockIO' in buildOciSpec(base).linux.resources).toBe(false);
    const blockIO = { weight: 300, throttleWriteBpsDevice: [{ major: 7, minor: 3, rate: 4194304 }] };
    expect(buildOciSpec({ ...base, blockIO }).linux.resources.blockIO).toEqual(blockIO);
  });
});
