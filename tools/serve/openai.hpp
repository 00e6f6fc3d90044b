// OpenAI's completions and chat completions APIs for a character-level model, as pure
// functions over JSON: the request bodies checked field by field into what the scheduler
// runs, the chat template, stop strings over a stream, and the response bodies, streamed
// chunks, model objects and error bodies the official clients read, and Completion, which
// turns the scheduler's tokens for one request into its stream or its body. Nothing here
// knows about sockets.
//
// The fields and their values (OpenAI's names and limits; null is the same as absent where
// OpenAI allows null):
//
//   both endpoints   model (the served name; another gets 404 model_not_found; may be left
//                    out), n (1…16), temperature (0…2; 0 is greedy), top_p ((0, 1]),
//                    top_k (0…V, −1 = 0 = all; an extension, as in vLLM), seed (0…2^64−1;
//                    absent: a fresh random seed per request), stream, stream_options
//                    ({include_usage}; with stream only), stop (a string or up to 4),
//                    presence_penalty and frequency_penalty ([−2, 2]), user (a string)
//   /v1/completions  prompt (a string, an array of strings, an array of token ids, or an
//                    array of arrays of token ids), max_tokens (1…context; absent: 16),
//                    echo, logprobs (0…5: the sampled token's log-probability and that many
//                    alternatives), best_of (1 or n), suffix (null or ""), logit_bias (null
//                    or {})
//   /v1/chat/completions  messages (system, developer, user or assistant; content a string
//                    or text parts; an optional name), max_completion_tokens or max_tokens
//                    (absent: the rest of the context), logprobs (true or false),
//                    top_logprobs (0…20, with logprobs)
//
// Any other field is refused, naming it. The log-probabilities are the model's own
// (attn::log_softmax of the raw logits, before the temperature, penalties and truncations).
#pragma once

#include "attn/data.hpp"
#include "attn/scheduler.hpp"
#include "attn/trainer.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace serve {

using json = nlohmann::json;

/// A request the client should change, in OpenAI's error shape: the HTTP status, the field
/// it is about (`param`, empty for the body as a whole), the error's type and code.
struct ApiError : std::runtime_error {
    ApiError(int status, std::string param, const std::string& message,
             std::string code = "", std::string type = "invalid_request_error");
    int status;
    std::string param, code, type;
};

/// `{"error": {"message", "type", "param", "code"}}`, param and code null when empty.
json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code = "");
json error_body(const ApiError& error);  ///< the same, from an ApiError

/// The model behind the endpoints.
struct ServedModel {
    std::string name;        ///< the id clients name in `model`
    attn::CharVocab vocab;   ///< its characters, in id order
    int context = 0;         ///< block_size: prompt + max_tokens − 1 positions at most
    std::int64_t created = 0;  ///< seconds since 1970, for the model object
};

enum class Endpoint { completions, chat };

constexpr int max_n = 16;              ///< choices per prompt
constexpr int max_choices = 64;        ///< prompts × n
constexpr int max_stop_strings = 4;    ///< OpenAI's limit
constexpr int max_completion_logprobs = 5;  ///< /v1/completions' `logprobs`
constexpr int max_chat_top_logprobs = 20;   ///< /v1/chat/completions' `top_logprobs`

/// A checked request.
struct Request {
    Endpoint endpoint = Endpoint::completions;
    std::vector<std::vector<int>> prompts;   ///< token ids, one list per prompt
    std::vector<std::string> prompt_texts;   ///< the same prompts as text (for echo)
    /// max_new_tokens, temperature (greedy: top_k 1), top_k, top_p, penalties, the seed, and
    /// top_logprobs (−1 when no log-probabilities are asked for)
    attn::SampleOptions options;
    bool seeded = false;         ///< the client gave the seed (else a fresh random one)
    int n = 1;                   ///< choices per prompt
    bool stream = false;
    bool include_usage = false;  ///< stream_options.include_usage: a last chunk with usage
    bool echo = false;           ///< the prompt goes before the completion's text
    std::vector<std::string> stop;  ///< the client's stop strings, and chat's end of turn
    std::string model;           ///< the served name
    std::string user;            ///< as given; not used
};

/// Reads a `/v1/completions` body. @throws ApiError (400, or 404 for another model)
Request parse_completions(const std::string& body, const ServedModel& model);
/// Reads a `/v1/chat/completions` body. @throws ApiError (400, or 404 for another model)
Request parse_chat(const std::string& body, const ServedModel& model);

/// Chat's end of turn: a blank line ends a speech in the play's text, so it ends the
/// assistant's turn (finish_reason "stop") and is never part of the reply.
constexpr std::string_view chat_end_of_turn = "\n\n";

/// The chat template, written in the play's speaker style: every message becomes
/// `SPEAKER:\ncontent\n\n`, where the speaker is the message's `name` or its role's
/// (`USER`, `ASSISTANT`); a system (or developer) message is written without a speaker, as
/// a stage direction; the text ends with the assistant's cue `ASSISTANT:\n`.
/// @param messages the request's `messages`, already checked
/// @return the prompt's text
std::string chat_template(const json& messages);

/// The first character of `text` outside the vocabulary, described for a message
/// (`'€' (U+20AC)`, control characters as `U+0000` alone), or nullopt.
std::optional<std::string> first_unknown_character(const attn::CharVocab& vocab, std::string_view text);

/// Stop strings over a stream of pieces of text. push() returns the text that is safe to
/// send: everything except a tail that could still become the start of a stop string.
/// When a stop string appears (the one that is complete first, the longest of those that
/// complete together), the text before it is released, the stop string and everything
/// after are dropped, and stopped() turns true. OpenAI's rule: the stop string is not sent.
class StopScanner {
public:
    /// @throws std::invalid_argument for an empty stop string
    explicit StopScanner(std::vector<std::string> stops);
    /// Takes the next piece of generated text. @return the text now safe to send
    std::string push(std::string_view piece);
    /// The generation ended without a stop: the text held back. @return it, once
    std::string finish();
    bool stopped() const { return stopped_; }  ///< a stop string appeared
    const std::string& held() const { return held_; }  ///< the text held back now

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool stopped_ = false;
};

/// What one choice produced: its tokens, their text (with the echoed prompt first when
/// echo), the log-probabilities of its tokens when asked, and why it ended.
struct Choice {
    int index = 0;
    std::string text;
    std::vector<int> tokens;                        ///< the tokens of the returned completion
    std::vector<attn::TokenLogprobs> logprobs;      ///< one per token, when asked
    bool has_logprobs = false;
    std::string finish_reason = "length";           ///< "length" or "stop"
    int text_offset = 0;  ///< characters before the first token in the full text (the prompt's)
};

struct Usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;
};

json usage_json(const Usage& usage);  ///< with total_tokens

/// The completions shape: {tokens, token_logprobs, top_logprobs: [{token: logprob}],
/// text_offset} over the choice's tokens, offsets counted in characters from `first_offset`.
json completion_logprobs(const attn::CharVocab& vocab, const std::vector<int>& tokens,
                         const std::vector<attn::TokenLogprobs>& logprobs, int first_offset);
/// The chat shape: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob,
/// bytes}]}], refusal: null}.
json chat_logprobs(const attn::CharVocab& vocab, const std::vector<int>& tokens,
                   const std::vector<attn::TokenLogprobs>& logprobs);

/// A whole response: `text_completion` or `chat.completion`, its choices and usage.
json response_body(Endpoint endpoint, const std::string& id, std::int64_t created,
                   const std::string& model, const attn::CharVocab& vocab,
                   const std::vector<Choice>& choices, const Usage& usage);

/// One streamed chunk of one choice: its new text (and, for chat, the role on the first),
/// the new tokens' log-probabilities when asked, and the finish reason on the last.
/// @param first whether it is the choice's first chunk (chat: the delta carries the role)
/// @param finish_reason empty until the choice's last chunk
json chunk_body(Endpoint endpoint, const std::string& id, std::int64_t created,
                const std::string& model, const attn::CharVocab& vocab, const Choice& piece,
                bool first, const std::string& finish_reason);
/// The last chunk when stream_options.include_usage: no choices, the usage.
json usage_chunk(Endpoint endpoint, const std::string& id, std::int64_t created,
                 const std::string& model, const Usage& usage);

/// A server-sent event: `data: <json>\n\n`.
std::string sse(const json& body);
/// The stream's end: `data: [DONE]\n\n`.
std::string sse_done();

/// One request's choices while the scheduler produces them: what to submit, the streamed
/// events each token makes, and the whole body at the end. Choice c = prompt × n + sample;
/// sample j runs with the request's seed + j (sample 0 gives the text train_gpt --sample
/// gives). A choice ends at its last token or at a stop string (then
/// finished(c) turns true and the server should cancel its sequence).
class Completion {
public:
    /// @param request a parsed request @param model the served model
    /// @param id the response's id @param created seconds since 1970
    Completion(const Request& request, const ServedModel& model, std::string id, std::int64_t created);

    /// One scheduler request per choice, in choice order.
    const std::vector<attn::CompletionRequest>& submissions() const { return submissions_; }
    int choices() const { return static_cast<int>(choices_.size()); }
    bool streaming() const { return request_.stream; }  ///< answered with server-sent events
    int samples() const { return request_.n; }          ///< choices per prompt

    /// Takes choice c's next token. @param logprobs the scheduler's, when asked for
    /// @param last the scheduler's last token for it (max_tokens reached)
    /// @return the server-sent events to send now (always empty when not streaming)
    std::string add(int choice, int token, const std::optional<attn::TokenLogprobs>& logprobs, bool last);
    bool finished(int choice) const;  ///< its last token came, or a stop string appeared
    bool finished() const;            ///< every choice has
    /// The stream's end: the usage chunk when include_usage, then `data: [DONE]`.
    std::string stream_end() const;
    /// The response of a request that was not streamed.
    json body() const;
    Usage usage() const;  ///< prompt tokens (each prompt once) and every token generated

private:
    struct State {
        State(const std::vector<std::string>& stops, int prompt_index)
            : scanner(stops), prompt(prompt_index) {}
        StopScanner scanner;
        int prompt;                   // which prompt
        std::string text;             // the text released so far
        std::vector<int> tokens;      // the tokens of that text
        std::vector<attn::TokenLogprobs> logprobs;
        struct Pending {
            int token;
            attn::TokenLogprobs logprobs;
            std::size_t bytes;
        };
        std::deque<Pending> pending;  // tokens whose text is held back
        std::size_t unclaimed = 0;    // bytes released but not yet given to a token
        int generated = 0;
        bool done = false, sent = false;
        std::string finish_reason;
    };

    Request request_;
    const ServedModel& model_;
    std::string id_;
    std::int64_t created_;
    std::vector<attn::CompletionRequest> submissions_;
    std::vector<State> choices_;
    std::vector<int> prompt_characters_;  // per prompt: its length in characters
};

json model_object(const ServedModel& model);  ///< `/v1/models/{id}`
json model_list(const ServedModel& model);    ///< `/v1/models`: {object: list, data: [it]}
/// `/v1/models/{id}`'s answer. @throws ApiError 404 model_not_found for another id
json retrieve_model(const ServedModel& model, const std::string& id);

}  // namespace serve
