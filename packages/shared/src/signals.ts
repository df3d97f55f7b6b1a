/**
 * The signals SignalProcess (podd.proto, server sandbox.proto) sends to a command exec started:
 * podd refuses any other name with INVALID_ARGUMENT, and `sandnode sandbox kill --signal`
 * refuses it before calling (a usage error, exit 2).
 */
export const SIGNAL_PROCESS_SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGKILL', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT', 'SIGWINCH'];
