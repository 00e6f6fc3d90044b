// OpenAI's completions and chat completions APIs for a character-level model (openai.hpp).
#include "openai.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

namespace serve {

using attn::CharVocab;
using attn::TokenLogprobs;
using std::to_string;

ApiError::ApiError(int status_, std::string param_, const std::string& message, std::string code_,
                   std::string type_)
    : std::runtime_error(message), status(status_), param(std::move(param_)), code(std::move(code_)),
      type(std::move(type_)) {}

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
    return {{"error", {{"message", message}, {"type", type},
                       {"param", param.empty() ? json(nullptr) : json(param)},
                       {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json error_body(const ApiError& e) { return error_body(e.what(), e.type, e.param, e.code); }

namespace {

ApiError bad(const std::string& param, const std::string& message) {
    return ApiError(400, param, param + ": " + message);
}

// The body as JSON. A number too large for a double (1e400) is refused on its field: the
// parser's callback notes each top-level key before its value is read.
json parse_body(const std::string& body) {
    std::string field;
    const json::parser_callback_t note_field = [&](int depth, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::key && depth == 1) field = parsed.get<std::string>();
        return true;
    };
    json j;
    try {
        j = json::parse(body, note_field);
    } catch (const json::out_of_range& e) {
        const std::string what = e.what();  // "[json.exception.out_of_range.406] number overflow parsing '1e400'"
        const auto quote = what.find('\'');
        const std::string number = quote == std::string::npos ? "" : " " + what.substr(quote);
        throw bad(field.empty() ? "body" : field,
                  "the number" + number + " is out of range (beyond ±1.8e308)");
    } catch (const json::exception& e) {
        throw ApiError(400, "", std::string("the body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw ApiError(400, "", "the body must be a JSON object");
    return j;
}

std::string quoted(const json& value) {
    std::string s = value.dump(-1, ' ', true, json::error_handler_t::replace);
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

// A whole number in [lo, hi]; any JSON integer (signed or unsigned) is compared exactly.
long long whole(const std::string& key, const json& value, long long lo, long long hi) {
    const std::string range = "a whole number in [" + to_string(lo) + ", " + to_string(hi) + "]";
    if (!value.is_number_integer()) throw bad(key, "must be " + range + ", got " + quoted(value));
    if (value.is_number_unsigned()) {
        const std::uint64_t u = value.get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(hi) || (lo > 0 && u < static_cast<std::uint64_t>(lo)))
            throw bad(key, "must be " + range + ", got " + quoted(value));
        return static_cast<long long>(value.get<std::uint64_t>());
    }
    const long long v = value.get<long long>();
    if (v < lo || v > hi) throw bad(key, "must be " + range + ", got " + quoted(value));
    return v;
}

double number(const std::string& key, const json& value, double lo, double hi, bool open_low = false) {
    const std::string range = std::string(open_low ? "(" : "[") + json(lo).dump() + ", " + json(hi).dump() + "]";
    if (!value.is_number()) throw bad(key, "must be a number in " + range + ", got " + quoted(value));
    const double v = value.get<double>();
    if (!(open_low ? v > lo : v >= lo) || !(v <= hi))
        throw bad(key, "must be a number in " + range + ", got " + quoted(value));
    return v;
}

bool boolean(const std::string& key, const json& value) {
    if (!value.is_boolean()) throw bad(key, "must be true or false, got " + quoted(value));
    return value.get<bool>();
}

std::uint64_t fresh_seed() {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

std::string code_point(std::string_view ch) {
    // the UTF-8 bytes of one character back to its code point
    const auto b = [&](std::size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(ch[i])); };
    unsigned cp = b(0);
    if (ch.size() == 2) cp = ((b(0) & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    if (ch.size() == 3) cp = ((b(0) & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    if (ch.size() == 4)
        cp = ((b(0) & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    char buf[16];
    std::snprintf(buf, sizeof buf, "U+%04X", cp);
    return buf;
}

// Checks a prompt's text and encodes it; an empty text starts from a newline, as
// attn::start_tokens does.
std::vector<int> encode_prompt(const ServedModel& m, const std::string& field, const std::string& text) {
    if (const auto unknown = first_unknown_character(m.vocab, text))
        throw bad(field, "the character " + *unknown + " is not in the model's vocabulary");
    if (text.empty() && m.vocab.can_encode("\n")) return m.vocab.encode("\n");
    if (text.empty()) return {0};
    return m.vocab.encode(text);
}

std::vector<int> token_ids(const ServedModel& m, const std::string& field, const json& ids) {
    if (ids.empty()) throw bad(field, "an empty list of token ids");
    std::vector<int> out;
    const int V = static_cast<int>(m.vocab.size());
    for (const json& id : ids) out.push_back(static_cast<int>(whole(field, id, 0, V - 1)));
    return out;
}

// The prompt field: a string, strings, token ids, or lists of token ids.
void read_prompt(Request& r, const ServedModel& m, const json& value) {
    const auto add = [&](std::vector<int> ids) {
        r.prompt_texts.push_back(m.vocab.decode(ids));
        r.prompts.push_back(std::move(ids));
    };
    const std::string forms =
        "must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
    if (value.is_string()) {
        add(encode_prompt(m, "prompt", value.get<std::string>()));
    } else if (value.is_array() && !value.empty() && value[0].is_number()) {
        add(token_ids(m, "prompt", value));
    } else if (value.is_array() && !value.empty()) {
        for (std::size_t i = 0; i < value.size(); ++i) {
            const std::string field = "prompt[" + to_string(i) + "]";
            if (value[i].is_string() && value[0].is_string())
                add(encode_prompt(m, field, value[i].get<std::string>()));
            else if (value[i].is_array() && value[0].is_array())
                add(token_ids(m, field, value[i]));
            else
                throw bad("prompt", forms + ", got " + quoted(value));
        }
    } else if (value.is_array()) {
        throw bad("prompt", "an empty array");
    } else {
        throw bad("prompt", forms + ", got " + quoted(value));
    }
    for (std::size_t i = 0; i < r.prompts.size(); ++i) {
        if (static_cast<int>(r.prompts[i].size()) > m.context)
            throw bad(r.prompts.size() == 1 ? std::string("prompt") : "prompt[" + to_string(i) + "]",
                      to_string(r.prompts[i].size()) + " tokens, past the model's context of " +
                          to_string(m.context));
    }
}

std::vector<std::string> read_stop(const json& value) {
    std::vector<std::string> stops;
    const auto one = [&](const json& s) {
        if (!s.is_string()) throw bad("stop", "must be a string or an array of up to 4 strings, got " + quoted(s));
        if (s.get<std::string>().empty()) throw bad("stop", "an empty stop string would stop at once");
        stops.push_back(s.get<std::string>());
    };
    if (value.is_array()) {
        if (value.size() > static_cast<std::size_t>(max_stop_strings))
            throw bad("stop", "at most " + to_string(max_stop_strings) + " strings, got " + to_string(value.size()));
        for (const json& s : value) one(s);
    } else {
        one(value);
    }
    return stops;
}

// A message's content: a string, or an array of text parts.
std::string message_text(const json& content, const std::string& field) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array())
        throw bad(field, "must be a string or an array of text parts, got " + quoted(content));
    std::string text;
    for (std::size_t i = 0; i < content.size(); ++i) {
        const json& part = content[i];
        const std::string pf = field + "[" + to_string(i) + "]";
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string() || part.size() != 2)
            throw bad(pf, "must be {\"type\": \"text\", \"text\": a string} (only text parts)");
        text += part["text"].get<std::string>();
    }
    return text;
}

// The messages, checked and rewritten with plain text content (for chat_template).
json read_messages(const json& value, const ServedModel& m) {
    if (!value.is_array() || value.empty())
        throw bad("messages", "must be a non-empty array of messages, got " + quoted(value));
    json out = json::array();
    for (std::size_t i = 0; i < value.size(); ++i) {
        const std::string field = "messages[" + to_string(i) + "]";
        const json& msg = value[i];
        if (!msg.is_object()) throw bad(field, "must be an object with role and content");
        json clean = json::object();
        for (const auto& [key, v] : msg.items()) {
            if (key == "role") {
                static const std::vector<std::string> roles = {"system", "developer", "user", "assistant"};
                if (!v.is_string() || std::find(roles.begin(), roles.end(), v.get<std::string>()) == roles.end())
                    throw bad(field + ".role", "must be system, developer, user or assistant, got " + quoted(v));
                clean["role"] = v;
            } else if (key == "content") {
                if (v.is_null() && msg.value("role", "") == "assistant") {
                    clean["content"] = "";
                    continue;
                }
                clean["content"] = message_text(v, field + ".content");
            } else if (key == "name") {
                if (!v.is_string() || v.get<std::string>().empty() ||
                    v.get<std::string>().find_first_of(":\n") != std::string::npos)
                    throw bad(field + ".name", "must be a non-empty string without ':' or a newline");
                clean["name"] = v;
            } else {
                throw bad(field + "." + key, "not a field of a message (role, content, name)");
            }
        }
        if (!clean.contains("role")) throw bad(field + ".role", "missing");
        if (!clean.contains("content")) throw bad(field + ".content", "missing");
        for (const char* key : {"content", "name"}) {
            if (!clean.contains(key)) continue;
            if (const auto unknown = first_unknown_character(m.vocab, clean[key].get<std::string>()))
                throw bad(field + "." + key, "the character " + *unknown + " is not in the model's vocabulary");
        }
        out.push_back(std::move(clean));
    }
    return out;
}

// The fields both endpoints share, and each one's own. Returns false for a field it does not
// know (the caller names it).
struct Fields {
    const json* max_tokens = nullptr;
    const json* max_completion_tokens = nullptr;
    const json* temperature = nullptr;
    const json* top_k = nullptr;
    const json* logprobs = nullptr;
    const json* top_logprobs = nullptr;
    const json* best_of = nullptr;
    const json* stream_options = nullptr;
};

bool read_common(Request& r, const ServedModel& m, const std::string& key, const json& value, Fields& f) {
    attn::SampleOptions& o = r.options;
    if (key == "model") {
        if (!value.is_string()) throw bad(key, "must be a string, got " + quoted(value));
        if (value.get<std::string>() != m.name)
            throw ApiError(404, "model",
                           "The model '" + value.get<std::string>() + "' does not exist; this server serves '" +
                               m.name + "'",
                           "model_not_found");
    } else if (key == "user") {
        if (!value.is_string()) throw bad(key, "must be a string, got " + quoted(value));
        r.user = value.get<std::string>();
    } else if (key == "n") {
        if (!value.is_null()) r.n = static_cast<int>(whole(key, value, 1, max_n));
    } else if (key == "max_tokens") {
        if (!value.is_null()) f.max_tokens = &value;
    } else if (key == "temperature") {
        if (!value.is_null()) f.temperature = &value;
    } else if (key == "top_k") {
        if (!value.is_null()) f.top_k = &value;
    } else if (key == "top_p") {
        if (value.is_null()) return true;
        const double p = number(key, value, 0.0, 1.0, true);
        if (!(static_cast<float>(p) > 0.0f))
            throw bad(key, quoted(value) + " becomes 0 as a float (the smallest is about 1.4e-45)");
        o.top_p = static_cast<float>(p);
    } else if (key == "seed") {
        if (value.is_null()) return true;
        if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<long long>() < 0))
            throw bad(key, "must be a whole number in [0, 18446744073709551615], got " + quoted(value));
        o.seed = value.get<std::uint64_t>();
        r.seeded = true;
    } else if (key == "stream") {
        if (!value.is_null()) r.stream = boolean(key, value);
    } else if (key == "stream_options") {
        if (!value.is_null()) f.stream_options = &value;
    } else if (key == "stop") {
        if (!value.is_null()) r.stop = read_stop(value);
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
        if (value.is_null()) return true;
        const float penalty = static_cast<float>(number(key, value, -2.0, 2.0));
        (key == "presence_penalty" ? o.presence_penalty : o.frequency_penalty) = penalty;
    } else if (key == "logprobs") {
        if (!value.is_null()) f.logprobs = &value;
    } else {
        return false;
    }
    return true;
}

// What both endpoints do once every field is read.
void finish_request(Request& r, const ServedModel& m, Fields& f, int default_max_tokens) {
    attn::SampleOptions& o = r.options;
    const int V = static_cast<int>(m.vocab.size());
    if (f.top_k) {
        const long long k = whole("top_k", *f.top_k, -1, V);
        o.top_k = k < 0 ? 0 : static_cast<int>(k);
    }
    if (f.temperature) {
        const double t = number("temperature", *f.temperature, 0.0, 2.0);
        if (t == 0.0) {
            o.top_k = 1;  // greedy: the most likely token every time
            o.temperature = 1.0f;
        } else if (!(static_cast<float>(t) > 0.0f)) {
            throw bad("temperature", quoted(*f.temperature) +
                                         " becomes 0 as a float (the smallest is about 1.4e-45); 0 is greedy");
        } else {
            o.temperature = static_cast<float>(t);
        }
    }
    if (f.stream_options) {
        if (!r.stream) throw bad("stream_options", "only allowed with \"stream\": true");
        if (!f.stream_options->is_object())
            throw bad("stream_options", "must be an object, got " + quoted(*f.stream_options));
        for (const auto& [key, value] : f.stream_options->items()) {
            if (key != "include_usage")
                throw bad("stream_options." + key, "not a field of stream_options (include_usage)");
            if (!value.is_null()) r.include_usage = boolean("stream_options.include_usage", value);
        }
    }
    if (static_cast<long long>(r.prompts.size()) * r.n > max_choices)
        throw bad("n", to_string(r.prompts.size()) + " prompts × n " + to_string(r.n) + " = " +
                           to_string(static_cast<long long>(r.prompts.size()) * r.n) + " choices, over the limit of " +
                           to_string(max_choices));
    std::size_t longest = 0;
    for (const auto& p : r.prompts) longest = std::max(longest, p.size());
    const long long room = static_cast<long long>(m.context) - static_cast<long long>(longest) + 1;
    const json* max = f.max_completion_tokens ? f.max_completion_tokens : f.max_tokens;
    const std::string max_field = f.max_completion_tokens ? "max_completion_tokens" : "max_tokens";
    if (max) {
        o.max_new_tokens = static_cast<int>(whole(max_field, *max, 1, m.context));
        if (o.max_new_tokens > room)
            throw bad(max_field, "the prompt's " + to_string(longest) + " tokens and " + to_string(o.max_new_tokens) +
                                     " new ones need " + to_string(longest + static_cast<std::size_t>(o.max_new_tokens) - 1) +
                                     " positions, past the model's context of " + to_string(m.context));
    } else {
        o.max_new_tokens = static_cast<int>(std::min<long long>(default_max_tokens, room));
    }
    if (!r.seeded) o.seed = fresh_seed();
}

}  // namespace

std::optional<std::string> first_unknown_character(const CharVocab& vocab, std::string_view text) {
    for (const std::string& ch : attn::utf8_characters(text)) {
        if (vocab.can_encode(ch)) continue;
        const unsigned char c = static_cast<unsigned char>(ch[0]);
        if (ch.size() == 1 && (c < 0x20 || c == 0x7F)) return code_point(ch);
        return "'" + ch + "' (" + code_point(ch) + ")";
    }
    return std::nullopt;
}

Request parse_completions(const std::string& body, const ServedModel& m) {
    const json j = parse_body(body);
    Request r;
    r.endpoint = Endpoint::completions;
    r.model = m.name;
    r.options.max_new_tokens = 16;
    Fields f;
    bool has_prompt = false;
    for (const auto& [key, value] : j.items()) {
        if (read_common(r, m, key, value, f)) continue;
        if (key == "prompt") {
            read_prompt(r, m, value);
            has_prompt = true;
        } else if (key == "echo") {
            if (!value.is_null()) r.echo = boolean(key, value);
        } else if (key == "best_of") {
            if (!value.is_null()) f.best_of = &value;
        } else if (key == "suffix") {
            if (!value.is_null() && !(value.is_string() && value.get<std::string>().empty()))
                throw bad(key, "not supported: the model writes left to right only (null or \"\" are accepted)");
        } else if (key == "logit_bias") {
            if (!value.is_null() && !(value.is_object() && value.empty()))
                throw bad(key, "not supported (null or {} are accepted)");
        } else {
            throw bad(key, "not a field of /v1/completions (model, prompt, max_tokens, temperature, top_p, top_k, n, "
                           "seed, stream, stream_options, stop, echo, logprobs, presence_penalty, "
                           "frequency_penalty, best_of, suffix, logit_bias, user)");
        }
    }
    if (!has_prompt) throw bad("prompt", "missing: a string, strings or token ids to continue");
    if (f.logprobs)
        r.options.top_logprobs = static_cast<int>(whole("logprobs", *f.logprobs, 0, max_completion_logprobs));
    if (f.best_of) {
        const long long b = whole("best_of", *f.best_of, 1, max_n);
        if (b != 1 && b != r.n)
            throw bad("best_of", "only 1 or n (" + to_string(r.n) + ") is supported: every choice drawn is returned");
    }
    if (r.echo && r.options.top_logprobs >= 0)
        throw bad("echo", "not supported together with logprobs (the prompt's log-probabilities are not computed)");
    finish_request(r, m, f, 16);
    return r;
}

Request parse_chat(const std::string& body, const ServedModel& m) {
    const json j = parse_body(body);
    Request r;
    r.endpoint = Endpoint::chat;
    r.model = m.name;
    Fields f;
    json messages;
    for (const auto& [key, value] : j.items()) {
        if (read_common(r, m, key, value, f)) continue;
        if (key == "messages") {
            messages = read_messages(value, m);
        } else if (key == "max_completion_tokens") {
            if (!value.is_null()) f.max_completion_tokens = &value;
        } else if (key == "top_logprobs") {
            if (!value.is_null()) f.top_logprobs = &value;
        } else {
            throw bad(key, "not a field of /v1/chat/completions (model, messages, max_completion_tokens, "
                           "max_tokens, temperature, top_p, top_k, n, seed, stream, stream_options, stop, "
                           "logprobs, top_logprobs, presence_penalty, frequency_penalty, user)");
        }
    }
    if (messages.is_null()) throw bad("messages", "missing: the conversation so far");
    const std::string prompt = chat_template(messages);
    if (const auto unknown = first_unknown_character(m.vocab, prompt))
        throw ApiError(400, "messages",
                       "messages: the chat template needs the character " + *unknown +
                           ", which this model's vocabulary lacks (use /v1/completions)");
    r.prompts.push_back(m.vocab.encode(prompt));
    r.prompt_texts.push_back(prompt);
    if (static_cast<int>(r.prompts[0].size()) > m.context)
        throw bad("messages", "the conversation takes " + to_string(r.prompts[0].size()) +
                                  " tokens in the chat template, past the model's context of " + to_string(m.context));
    const bool logprobs = f.logprobs && boolean("logprobs", *f.logprobs);
    if (f.top_logprobs) {
        const int top = static_cast<int>(whole("top_logprobs", *f.top_logprobs, 0, max_chat_top_logprobs));
        if (!logprobs) throw bad("top_logprobs", "needs \"logprobs\": true");
        r.options.top_logprobs = std::min(top, static_cast<int>(m.vocab.size()));
    } else if (logprobs) {
        r.options.top_logprobs = 0;
    }
    r.stop.emplace_back(chat_end_of_turn);
    finish_request(r, m, f, m.context);
    return r;
}

std::string chat_template(const json& messages) {
    std::string text;
    for (const json& msg : messages) {
        const std::string role = msg.at("role").get<std::string>();
        const std::string content = msg.at("content").get<std::string>();
        if (role == "system" || role == "developer") {
            text += content + "\n\n";  // a stage direction: no speaker
            continue;
        }
        const std::string speaker =
            msg.contains("name") ? msg["name"].get<std::string>() : role == "user" ? "USER" : "ASSISTANT";
        text += speaker + ":\n" + content + "\n\n";
    }
    return text + "ASSISTANT:\n";
}

// ---------------------------------------------------------------------------------------
// Stop strings

StopScanner::StopScanner(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (const std::string& s : stops_)
        if (s.empty()) throw std::invalid_argument("stop: an empty stop string");
}

std::string StopScanner::push(std::string_view piece) {
    if (stopped_) return {};
    held_ += piece;
    // The held text had no whole stop string before this piece: any now ends in the piece.
    // The first to end wins; of those ending together, the one starting first.
    std::size_t best_end = std::string::npos, best_start = 0;
    for (const std::string& s : stops_) {
        const std::size_t at = held_.find(s);
        if (at == std::string::npos) continue;
        const std::size_t end = at + s.size();
        if (end < best_end || (end == best_end && at < best_start)) best_end = end, best_start = at;
    }
    if (best_end != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, best_start);
        held_.clear();
        return out;
    }
    // Hold back the longest tail that is the start of some stop string.
    std::size_t keep = 0;
    for (const std::string& s : stops_) {
        for (std::size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
            if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
                keep = len;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopScanner::finish() {
    std::string out;
    out.swap(held_);
    return stopped_ ? std::string() : out;
}

// ---------------------------------------------------------------------------------------
// Responses

json usage_json(const Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {

json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

void require_lengths(const std::vector<int>& tokens, const std::vector<TokenLogprobs>& logprobs) {
    if (tokens.size() != logprobs.size())
        throw std::invalid_argument("logprobs: " + to_string(tokens.size()) + " tokens but " +
                                    to_string(logprobs.size()) + " log-probabilities");
}

}  // namespace

json completion_logprobs(const CharVocab& vocab, const std::vector<int>& tokens,
                         const std::vector<TokenLogprobs>& logprobs, int first_offset) {
    require_lengths(tokens, logprobs);
    json out = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        out["tokens"].push_back(vocab.at(tokens[i]));
        out["token_logprobs"].push_back(logprobs[i].logprob);
        json top = json::object();
        for (const auto& [id, lp] : logprobs[i].top) top[vocab.at(id)] = lp;
        out["top_logprobs"].push_back(std::move(top));
        out["text_offset"].push_back(first_offset + static_cast<int>(i));
    }
    return out;
}

json chat_logprobs(const CharVocab& vocab, const std::vector<int>& tokens,
                   const std::vector<TokenLogprobs>& logprobs) {
    require_lengths(tokens, logprobs);
    json content = json::array();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        json top = json::array();
        for (const auto& [id, lp] : logprobs[i].top)
            top.push_back({{"token", vocab.at(id)}, {"logprob", lp}, {"bytes", bytes_of(vocab.at(id))}});
        const std::string& token = vocab.at(tokens[i]);
        content.push_back({{"token", token}, {"logprob", logprobs[i].logprob}, {"bytes", bytes_of(token)},
                           {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
}

namespace {

json choice_logprobs(Endpoint endpoint, const CharVocab& vocab, const Choice& c) {
    if (!c.has_logprobs) return nullptr;
    return endpoint == Endpoint::chat ? chat_logprobs(vocab, c.tokens, c.logprobs)
                                      : completion_logprobs(vocab, c.tokens, c.logprobs, c.text_offset);
}

json envelope(const char* object, const std::string& id, std::int64_t created, const std::string& model) {
    return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

}  // namespace

json response_body(Endpoint endpoint, const std::string& id, std::int64_t created, const std::string& model,
                   const CharVocab& vocab, const std::vector<Choice>& choices, const Usage& usage) {
    const bool chat = endpoint == Endpoint::chat;
    json body = envelope(chat ? "chat.completion" : "text_completion", id, created, model);
    json list = json::array();
    for (const Choice& c : choices) {
        json item = {{"index", c.index}};
        if (chat)
            item["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
        else
            item["text"] = c.text;
        item["logprobs"] = choice_logprobs(endpoint, vocab, c);
        item["finish_reason"] = c.finish_reason;
        list.push_back(std::move(item));
    }
    body["choices"] = std::move(list);
    body["usage"] = usage_json(usage);
    return body;
}

json chunk_body(Endpoint endpoint, const std::string& id, std::int64_t created, const std::string& model,
                const CharVocab& vocab, const Choice& piece, bool first, const std::string& finish_reason) {
    const bool chat = endpoint == Endpoint::chat;
    json body = envelope(chat ? "chat.completion.chunk" : "text_completion", id, created, model);
    json item = {{"index", piece.index}};
    if (chat) {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (!piece.text.empty() || first) delta["content"] = piece.text;
        item["delta"] = std::move(delta);
    } else {
        item["text"] = piece.text;
    }
    item["logprobs"] = choice_logprobs(endpoint, vocab, piece);
    item["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
    body["choices"] = json::array({std::move(item)});
    return body;
}

json usage_chunk(Endpoint endpoint, const std::string& id, std::int64_t created, const std::string& model,
                 const Usage& usage) {
    json body = envelope(endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion", id, created, model);
    body["choices"] = json::array();
    body["usage"] = usage_json(usage);
    return body;
}

std::string sse(const json& body) {
    // replace: text cut inside a character must not throw while streaming
    return "data: " + body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_done() { return "data: [DONE]\n\n"; }

// ---------------------------------------------------------------------------------------
// A request's choices as they are produced

namespace {

// Sample j of a request draws with seed + j (wrapping): the seeds the scheduler gives the n
// continuations it forks from one prompt, so either way a request gives the same texts.
std::uint64_t derived_seed(std::uint64_t seed, int sample) { return seed + static_cast<std::uint64_t>(sample); }

}  // namespace

Completion::Completion(const Request& request, const ServedModel& model, std::string id, std::int64_t created)
    : request_(request), model_(model), id_(std::move(id)), created_(created) {
    for (std::size_t p = 0; p < request_.prompts.size(); ++p) {
        prompt_characters_.push_back(static_cast<int>(attn::utf8_characters(request_.prompt_texts[p]).size()));
        for (int j = 0; j < request_.n; ++j) {
            attn::CompletionRequest r{request_.prompts[p], request_.options};
            if (j > 0) r.options.seed = derived_seed(request_.options.seed, j);
            submissions_.push_back(std::move(r));
            choices_.emplace_back(request_.stop, static_cast<int>(p));
        }
    }
}

bool Completion::finished(int choice) const { return choices_.at(static_cast<std::size_t>(choice)).done; }

bool Completion::finished() const {
    return std::all_of(choices_.begin(), choices_.end(), [](const State& s) { return s.done; });
}

std::string Completion::add(int choice, int token, const std::optional<TokenLogprobs>& logprobs, bool last) {
    State& c = choices_.at(static_cast<std::size_t>(choice));
    if (c.done) return {};
    ++c.generated;
    const std::string& piece = model_.vocab.at(token);
    c.pending.push_back({token, logprobs.value_or(TokenLogprobs{}), piece.size()});
    std::string released = c.scanner.push(piece);
    if (c.scanner.stopped()) {
        c.done = true;
        c.finish_reason = "stop";
    } else if (last) {
        released += c.scanner.finish();
        c.done = true;
        c.finish_reason = "length";
    }
    // the tokens whose every byte is now released (a stop string starts on a character's
    // first byte, so the text before it holds whole tokens)
    Choice fresh;
    fresh.index = choice;
    fresh.has_logprobs = request_.options.top_logprobs >= 0;
    fresh.text_offset = prompt_characters_[static_cast<std::size_t>(c.prompt)] + static_cast<int>(c.tokens.size());
    c.unclaimed += released.size();
    while (!c.pending.empty() && c.pending.front().bytes <= c.unclaimed) {
        c.unclaimed -= c.pending.front().bytes;
        fresh.tokens.push_back(c.pending.front().token);
        if (fresh.has_logprobs) fresh.logprobs.push_back(c.pending.front().logprobs);
        c.pending.pop_front();
    }
    if (c.done) c.pending.clear();  // past a stop string: never sent
    c.tokens.insert(c.tokens.end(), fresh.tokens.begin(), fresh.tokens.end());
    c.logprobs.insert(c.logprobs.end(), fresh.logprobs.begin(), fresh.logprobs.end());
    c.text += released;
    if (!request_.stream) return {};
    const bool first = !c.sent;
    if (released.empty() && !c.done && !(first && request_.endpoint == Endpoint::chat)) return {};
    fresh.text = (first && request_.echo ? request_.prompt_texts[static_cast<std::size_t>(c.prompt)] : "") + released;
    c.sent = true;
    return sse(chunk_body(request_.endpoint, id_, created_, request_.model, model_.vocab, fresh, first,
                          c.done ? c.finish_reason : ""));
}

Usage Completion::usage() const {
    Usage u;
    for (const auto& p : request_.prompts) u.prompt_tokens += static_cast<int>(p.size());
    for (const State& c : choices_) u.completion_tokens += c.generated;
    return u;
}

std::string Completion::stream_end() const {
    std::string out;
    if (request_.include_usage) out += sse(usage_chunk(request_.endpoint, id_, created_, request_.model, usage()));
    return out + sse_done();
}

json Completion::body() const {
    std::vector<Choice> list;
    for (std::size_t i = 0; i < choices_.size(); ++i) {
        const State& c = choices_[i];
        Choice out;
        out.index = static_cast<int>(i);
        out.text = (request_.echo ? request_.prompt_texts[static_cast<std::size_t>(c.prompt)] : "") + c.text;
        out.tokens = c.tokens;
        out.logprobs = c.logprobs;
        out.has_logprobs = request_.options.top_logprobs >= 0;
        out.finish_reason = c.done ? c.finish_reason : "length";
        out.text_offset = prompt_characters_[static_cast<std::size_t>(c.prompt)];
        list.push_back(std::move(out));
    }
    return response_body(request_.endpoint, id_, created_, request_.model, model_.vocab, list, usage());
}

json model_object(const ServedModel& m) {
    return {{"id", m.name}, {"object", "model"}, {"created", m.created}, {"owned_by", "attention-from-scratch"}};
}

json model_list(const ServedModel& m) { return {{"object", "list"}, {"data", json::array({model_object(m)})}}; }

json retrieve_model(const ServedModel& m, const std::string& id) {
    if (id != m.name)
        throw ApiError(404, "model", "The model '" + id + "' does not exist; this server serves '" + m.name + "'",
                       "model_not_found");
    return model_object(m);
}

}  // namespace serve
