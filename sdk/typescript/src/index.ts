// @cella/sdk: the TypeScript (and JavaScript) SDK of Cella, a self-hosted sandbox platform.

export { Sandbox, SandboxPaginator } from './sandbox.js';
export { Commands, CommandHandle } from './commands.js';
export { Files, WatchHandle } from './files.js';
export { CodeInterpreter, Execution } from './code.js';
export { Pty, PtyHandle } from './pty.js';
export { Snapshot, Artifact, Template, TemplateBuild } from './resources.js';
export { Task, TaskRun, isTerminal } from './tasks.js';
export { Workspace } from './workspace.js';
export { ApiKey } from './keys.js';
export { Image, User } from './images.js';
export { ConnectionConfig, DEFAULT_SERVER } from './http.js';
export {
  CellaError,
  InvalidRequestError,
  UnknownLanguageError,
  SizeUnavailableError,
  AuthenticationError,
  InsufficientFundsError,
  PermissionDeniedError,
  NotFoundError,
  MethodNotAllowedError,
  ConflictError,
  SandboxNotRunningError,
  GoneError,
  PayloadTooLargeError,
  RangeNotSatisfiableError,
  RateLimitedError,
  ConcurrencyLimitError,
  InternalServerError,
  UnavailableError,
  ConnectionError,
  TimeoutError,
  TemplateBuildError,
} from './errors.js';
export type { CellaErrorFields } from './errors.js';
export type * from './types.js';
