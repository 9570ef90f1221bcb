"""The chat templates houchu knows by name, and which one a model without its own gets.

A GGUF file or Hugging Face folder usually carries its chat template
(``tokenizer.chat_template``, ``chat_template.jinja``); many do not (base-model
conversions, older or re-quantized files), and chat requests to them had no prompt
format. Such a model gets its family's known template, picked by architecture as
llama.cpp picks one (``llm_chat_detect_template``, the ``LLM_CHAT_TEMPLATE`` names):
GGUF ``general.architecture`` or HF ``model_type``, refined by the vocabulary where one
architecture holds several chat formats (a ``llama`` file may be Llama 2, Llama 3,
SmolLM's ChatML or Mistral). ``--chat-template NAME|FILE`` (vLLM's and llama-server's
flag) overrides any of them: a name of ``KNOWN_TEMPLATES``, a path to a Jinja file, or
an inline Jinja template (as vLLM accepts).

The templates are Jinja, rendered like a model's own (transformers'
``apply_chat_template``, with ``bos_token`` / ``add_generation_prompt``), and write the
same text as llama.cpp's built-in formats (``llm_chat_apply_template``). llama.cpp's
tokenizer adds the BOS a model asks for; houchu's chat path adds none (a template writes
its own, as Hugging Face templates do), so the templates of families that start with BOS
write ``bos_token`` once, at the start. This module is the one owner of the table:
everything else imports it.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

#: Gemma (google/gemma-*-it): no system role (a system message is folded into the next
#: user turn, trimmed, then a blank line), ``model`` is the assistant's role, contents
#: trimmed (llama.cpp's "gemma").
_GEMMA = r"""{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + message['content'] | trim -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if ns.system and role != 'model' -%}
{{- ns.system + '\n\n' -}}
{%- set ns.system = '' -%}
{%- endif -%}
{{- message['content'] | trim + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}"""

#: ChatML (Qwen2/2.5/3, SmolLM, Hermes): no BOS (llama.cpp's "chatml").
_CHATML = r"""{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}"""

#: Llama 3 (llama.cpp's "llama3"): contents trimmed.
_LLAMA3 = r"""{{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' -}}
{{- message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}"""

#: Llama 2 chat: a ``<<SYS>>`` block in the first turn, BOS before each turn
#: (llama.cpp's "llama2-sys-bos"). A user turn ends the prompt with ``[/INST]``.
_LLAMA2 = r"""{{- bos_token + '[INST] ' -}}
{%- set ns = namespace(open=true) -%}
{%- for message in messages -%}
{%- if not ns.open -%}
{{- bos_token + '[INST] ' -}}
{%- set ns.open = true -%}
{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- message['content'] + ' [/INST]' -}}
{%- else -%}
{{- message['content'] + '</s>' -}}
{%- set ns.open = false -%}
{%- endif -%}
{%- endfor -%}"""


#: Mistral v3 (Mistral 7B v0.3, Mixtral 8x22B; llama.cpp's "mistral-v3"): a system
#: message opens the next user turn; a reply follows a space, trimmed.
_MISTRAL_V3 = r"""{{- bos_token -}}
{%- set ns = namespace(open=false) -%}
{%- for message in messages -%}
{%- if not ns.open -%}
{{- '[INST] ' -}}
{%- set ns.open = true -%}
{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- message['content'] + '[/INST]' -}}
{%- else -%}
{{- ' ' + message['content'] | trim + '</s>' -}}
{%- set ns.open = false -%}
{%- endif -%}
{%- endfor -%}"""

#: Mistral v1 (Mistral 7B v0.1/v0.2, Mixtral 8x7B, vocabularies without an ``[INST]``
#: token; llama.cpp's "mistral-v1"): v3's turns with a space before ``[INST]`` and
#: ``[/INST]``, the reply as it is.
_MISTRAL_V1 = r"""{{- bos_token -}}
{%- set ns = namespace(open=false) -%}
{%- for message in messages -%}
{%- if not ns.open -%}
{{- ' [INST] ' -}}
{%- set ns.open = true -%}
{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- message['content'] + ' [/INST]' -}}
{%- else -%}
{{- ' ' + message['content'] + '</s>' -}}
{%- set ns.open = false -%}
{%- endif -%}
{%- endfor -%}"""


#: DeepSeek-V2 chat (llama.cpp's "deepseek2").
_DEEPSEEK2 = r"""{{- bos_token -}}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- 'User: ' + message['content'] + '\n\n' -}}
{%- elif message['role'] == 'assistant' -%}
{{- 'Assistant: ' + message['content'] + '<｜end▁of▁sentence｜>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- 'Assistant:' -}}
{%- endif -%}"""

#: DeepSeek-V3 / V2.5 (llama.cpp's "deepseek3").
_DEEPSEEK3 = r"""{{- bos_token -}}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- '<｜User｜>' + message['content'] -}}
{%- elif message['role'] == 'assistant' -%}
{{- '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<｜Assistant｜>' -}}
{%- endif -%}"""

#: The built-in templates, by llama.cpp's names (``--chat-template NAME``).
KNOWN_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML,
    "deepseek2": _DEEPSEEK2,
    "deepseek3": _DEEPSEEK3,
    "gemma": _GEMMA,
    "llama2": _LLAMA2,
    "llama3": _LLAMA3,
    "mistral-v1": _MISTRAL_V1,
    "mistral-v3": _MISTRAL_V3,
}

#: A family's template by GGUF ``general.architecture`` or HF ``model_type``.
FAMILY_TEMPLATES: dict[str, str] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3_text": "gemma",
    "qwen2": "chatml",
    "qwen2moe": "chatml",
    "qwen2_moe": "chatml",
    "qwen3": "chatml",
    "qwen3moe": "chatml",
    "qwen3_moe": "chatml",
    "smollm3": "chatml",
    "llama": "llama2",
    "mistral": "mistral-v1",
    "deepseek2": "deepseek2",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek3",
}

#: Architectures whose checkpoints come in several chat formats: a marker token of
#: another format in the vocabulary picks that one (first match), as llama.cpp tells
#: them apart by their tokens. A ``llama`` GGUF may be Llama 3, SmolLM (ChatML) or
#: Mistral; ``deepseek2`` holds DeepSeek-V2, V2.5 and V3.
VOCABULARY_MARKERS: dict[str, tuple[tuple[str, str], ...]] = {
    "llama": (
        ("<|start_header_id|>", "llama3"),
        ("<|im_start|>", "chatml"),
        ("[INST]", "mistral-v3"),
    ),
    "mistral": (("[INST]", "mistral-v3"), ("<|im_start|>", "chatml")),
    "deepseek2": (("<｜User｜>", "deepseek3"),),
    "deepseek_v2": (("<｜User｜>", "deepseek3"),),
}

#: Every marker token ``family_template`` may look for.
MARKER_TOKENS: frozenset[str] = frozenset(
    token for markers in VOCABULARY_MARKERS.values() for token, _ in markers
)


class ChatTemplateError(ValueError):
    """A ``--chat-template`` value that is no known name, no readable file and no
    Jinja template, or a template that does not compile."""


@dataclass(frozen=True)
class TemplateChoice:
    """The chat template a model is served with, and where it came from.

    Attributes:
        template: the Jinja text (None: chat requests are refused).
        source: for the start-up line: "the model's own", "gemma, built in for
            architecture gemma3 (the model has none)", "--chat-template gemma", ...
    """

    template: str | None
    source: str


def family_template(architecture: str | None, vocabulary: Container[str] = ()) -> str | None:
    """The known template name of ``architecture`` (GGUF ``general.architecture`` or HF
    ``model_type``), refined by the marker tokens found in ``vocabulary``; None when the
    family has none."""
    if not architecture:
        return None
    for token, name in VOCABULARY_MARKERS.get(architecture, ()):
        if token in vocabulary:
            return name
    return FAMILY_TEMPLATES.get(architecture)


def flag_template(value: str) -> tuple[str, str]:
    """``(Jinja text, what it is)`` of a ``--chat-template`` value: a known name, a path
    to a Jinja file, or an inline Jinja template (a value with ``{{`` or ``{%``).

    Raises:
        ChatTemplateError: not a known name, no such file (or unreadable), or a
            template that does not compile (the message is one line).
    """
    if value in KNOWN_TEMPLATES:
        return KNOWN_TEMPLATES[value], value
    path = Path(value).expanduser()
    if "\n" not in value and len(value) < 4096 and path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"--chat-template {value}: cannot read it: {exc}") from None
        if not text.strip():
            raise ChatTemplateError(f"--chat-template {value}: the file is empty")
        check_template(text, f"--chat-template {value}")
        return text, str(path.resolve())
    if "{{" in value or "{%" in value:
        check_template(value, "--chat-template (inline)")
        return value, "inline"
    names = ", ".join(sorted(KNOWN_TEMPLATES))
    raise ChatTemplateError(
        f"--chat-template {value!r}: not a known template name ({names}), not a file, "
        "and not an inline Jinja template"
    )


def check_template(text: str, what: str) -> None:
    """Compile the Jinja ``text`` as the renderer will (transformers' environment).

    Raises:
        ChatTemplateError: it does not compile (one line: where and why).
    """
    import jinja2

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers layout: jinja's own parse
        import jinja2.ext
        import jinja2.sandbox

        def _compile_jinja_template(t: str) -> object:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols])
            return env.parse(t)

    try:
        _compile_jinja_template(text)
    except jinja2.TemplateError as exc:
        lineno = getattr(exc, "lineno", None)  # a TemplateSyntaxError's
        line = f" (line {lineno})" if lineno else ""
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ChatTemplateError(f"{what}: not a valid Jinja template{line}: {message}") from None


def choose_template(
    own: str | None,
    architecture: str | None,
    vocabulary: Container[str] = (),
    flag: str | None = None,
) -> TemplateChoice:
    """The template to serve: ``--chat-template``'s (``flag``) over the model's ``own``
    over its family's (``family_template``), else none.

    Raises:
        ChatTemplateError: a bad ``flag`` (``flag_template``).
    """
    if flag is not None:
        text, what = flag_template(flag)
        return TemplateChoice(text, f"{what} (--chat-template)")
    if own is not None:
        return TemplateChoice(own, "the model's own")
    name = family_template(architecture, vocabulary)
    if name is not None:
        return TemplateChoice(
            KNOWN_TEMPLATES[name],
            f"{name}, built in for architecture {architecture} (the model has none)",
        )
    arch = f"architecture {architecture}" if architecture else "an unknown architecture"
    return TemplateChoice(
        None,
        f"none (the model has none and {arch} has no built-in one: chat requests are "
        "refused; set one with --chat-template NAME|FILE)",
    )
