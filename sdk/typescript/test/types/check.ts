// The SDK's public object types held against the server's OpenAPI document: tsc --noEmit
// (test/types/tsconfig.json) fails when a field is renamed, dropped or added on either side, or
// its type changes. openapi.generated.ts is written from a running server's
// /api/v1/openapi.json by scripts/openapi-types.mjs (run-tests.sh does both).
//
// The SDK's objects are the API's with camelCase keys (deeply, but for user maps), and RFC
// 3339 times as Dates; `Wire` is that conversion at the type level, as src/convert.ts does it.

import type * as Sdk from '@cella/sdk';
import type * as Api from './openapi.generated.js';

type CamelKey<S extends string> = S extends `${infer H}_${infer T}` ? `${H}${Capitalize<CamelKey<T>>}` : S;

/** Fields (snake_case) whose times the SDK turns into Dates (src/convert.ts DATES). */
type DateKey =
  | 'created_at'
  | 'started_at'
  | 'ready_at'
  | 'destroyed_at'
  | 'ended_at'
  | 'modified_at'
  | 'measured_at'
  | 'expires_at'
  | 'last_used_at'
  | 'finished_at'
  | 'queued_at';
/** User maps, kept as they are. */
type Opaque = 'metadata' | 'env' | 'details';

type DateOf<T> = T extends string ? Date : T;

/** An API type as the SDK hands it over; `D`: more fields that become Dates. */
type Wire<T, D extends string = never> = T extends Date
  ? T
  : T extends readonly (infer U)[]
  ? Wire<U, D>[]
  : T extends object
    ? {
        -readonly [K in keyof T as K extends string ? CamelKey<K> : K]-?: K extends DateKey | D
          ? DateOf<Exclude<T[K], undefined>>
          : K extends Opaque
            ? Exclude<T[K], undefined>
            : Wire<Exclude<T[K], undefined>, D>;
      }
    : T;

/** The declared keys of a type, without its index signature. */
type KnownKeys<T> = keyof { [K in keyof T as string extends K ? never : number extends K ? never : symbol extends K ? never : K]: T[K] };

type Mutual<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
/**
 * The SDK's type of a field agrees with the API's: the same type, or (where the API says only
 * `string`) the SDK's list of the values it knows, e.g. a state's names.
 */
type Agrees<A, S> =
  Mutual<A, S> extends true
    ? true
    : null extends A
      ? null extends S
        ? Agrees<Exclude<A, null>, Exclude<S, null>>
        : false
      : [A, S] extends [readonly (infer AE)[], readonly (infer SE)[]]
        ? Agrees<AE, SE>
        : [A, S] extends [object, object]
          ? [Differences<S, A>] extends [never]
            ? true
            : false
          : [S] extends [A]
            ? string extends A
              ? true
              : false
            : false;

/** `S` without the declared key `K` (Omit would lose the declared keys of a type with an index signature). */
type Without<S, K extends PropertyKey> = { [P in KnownKeys<S> as P extends K ? never : P]: S[P] };
type Def<T> = Exclude<T, undefined>;

/**
 * Every difference between an SDK type `S` and the API schema `A`, named: `never` when they
 * agree. `Extras`: keys the SDK adds (aliases, methods); `Omitted`: API keys it leaves out.
 */
type Differences<S, A, Extras extends PropertyKey = never, Omitted extends PropertyKey = never, D extends string = never> =
  | { [K in Exclude<keyof Wire<A, D>, KnownKeys<S> | Omitted>]: `the SDK type lacks the API field ${K & string}` }[Exclude<keyof Wire<A, D>, KnownKeys<S> | Omitted>]
  | { [K in Exclude<KnownKeys<S>, keyof Wire<A, D> | Extras>]: `the SDK type has ${K & string}, which the API does not` }[Exclude<KnownKeys<S>, keyof Wire<A, D> | Extras>]
  | {
      [K in KnownKeys<S> & keyof Wire<A, D>]: Agrees<Def<Wire<A, D>[K]>, Def<S[K]>> extends true
        ? never
        : `the type of ${K & string} differs from the API's`;
    }[KnownKeys<S> & keyof Wire<A, D>];

/**
 * The differences between an SDK options type `S` and the API's request body `A`: every field
 * of the body has an option, every option (but `Extras`, e.g. connection options) a field,
 * and each option's values are ones the API takes.
 */
type RequestDifferences<S, A, Extras extends PropertyKey = never> = BodyDifferences<S, Body<A>, Extras>;

/** A request body as the SDK's options spell it: camelCase, times as Dates or strings. */
type Body<T> = {
  [K in keyof T as K extends string ? CamelKey<K> : K]-?: K extends DateKey ? Date | string : Exclude<T[K], undefined>;
};

type BodyDifferences<S, B, Extras extends PropertyKey> =
  | { [K in Exclude<keyof B, KnownKeys<S>>]: `the SDK takes no option for the API field ${K & string}` }[Exclude<keyof B, KnownKeys<S>>]
  | { [K in Exclude<KnownKeys<S>, keyof B | Extras>]: `the SDK takes ${K & string}, which the API does not` }[Exclude<KnownKeys<S>, keyof B | Extras>]
  | {
      [K in KnownKeys<S> & keyof B]: [Def<S[K]>] extends [Def<B[K]>] ? never : `the API does not take every value of ${K & string}`;
    }[KnownKeys<S> & keyof B];

type Connection = keyof Sdk.ConnectionOptions | 'signal';

/** Fails the type check with the differences' names unless there are none. */
type Agree<T extends never> = T;

export type Checks = [
  Agree<Differences<Sdk.SandboxInfo, Api.Sandbox, 'sandboxId'>>,
  Agree<Differences<Sdk.ResourceContract, Api.ResourceContract>>,
  Agree<Differences<Required<Sdk.NetworkPolicy>, Api.NetworkPolicy>>,
  Agree<Differences<Sdk.SandboxUsage, Api.Usage>>,
  Agree<Differences<Sdk.PreviewToken, Api.PreviewToken>>,
  Agree<Differences<Sdk.ProcessInfo, Api.Process>>,
  Agree<Differences<Sdk.CommandResult, Api.ExecResult>>,
  Agree<Differences<Sdk.EntryInfo, Api.FileEntry>>,
  Agree<Differences<Sdk.Execution, Api.CodeResult, 'text' | 'toJSON'>>,
  Agree<Differences<Sdk.ExecutionError, Api.CodeError>>,
  Agree<Differences<Sdk.OutputData, Api.CodeOutput>>,
  Agree<Differences<Sdk.KernelInfo, Api.KernelInfo>>,
  Agree<Differences<Sdk.SnapshotInfo, Api.Snapshot>>,
  Agree<Differences<Sdk.ArtifactInfo, Api.Artifact, 'read'>>,
  // Its artifacts are ArtifactInfo objects, checked above (with a read() the API has not).
  Agree<Differences<Without<Sdk.RunResult, 'artifacts'>, Without<Api.RunResult, 'artifacts'>>>,
  Agree<Differences<Sdk.TemplateInfo, Api.Template>>,
  Agree<Differences<Sdk.TemplateBuildInfo, Api.TemplateBuild>>,
  Agree<Differences<Sdk.BuildStep, Api.BuildStep>>,
  Agree<Differences<Sdk.TaskInfo, Api.Task>>,
  Agree<Differences<Sdk.PullRequest, Api.PullRequest>>,
  Agree<Differences<Sdk.WorkspaceInfo, Api.Workspace>>,
  Agree<Differences<Sdk.WorkspaceSettings, Api.WorkspaceSettings>>,
  Agree<Differences<Sdk.Wallet, Api.Wallet>>,
  Agree<Differences<Sdk.LedgerEntry, Api.LedgerEntry, never, never, 'at'>>,
  Agree<Differences<Sdk.UsageReport, Api.UsageReport, never, never, 'from' | 'to'>>,
  Agree<Differences<Sdk.UsageFigures, Api.UsageFigures>>,
  Agree<Differences<Sdk.WorkspaceStorage, Api.WorkspaceStorage>>,
  Agree<Differences<Sdk.Member, Api.Member>>,
  Agree<Differences<Sdk.ApiKeyInfo, Api.ApiKey>>,
  Agree<Differences<Sdk.ImageInfo, Api.ImportedImage>>,
  Agree<Differences<Sdk.UserInfo, Api.User>>,
  // Request bodies the SDK's options map one to one.
  Agree<RequestDifferences<Sdk.TaskStartOptions, Api.CreateTask, Connection>>,
  Agree<RequestDifferences<Sdk.ForkOptions, Api.ForkRequest>>,
  Agree<RequestDifferences<Sdk.NetworkPolicy, Api.NetworkPolicy>>,
  Agree<RequestDifferences<Sdk.WorkspaceCreateOptions, Api.CreateWorkspace, Connection>>,
  Agree<RequestDifferences<Sdk.ApiKeyCreateOptions, Api.CreateApiKey, Connection>>,
  Agree<RequestDifferences<Sdk.UserCreateOptions, Api.CreateUser, Connection>>,
];
